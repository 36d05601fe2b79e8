"""Prefix affinity in claims (claim.lua, warm.lua): a worker takes first the queued
requests whose prefix it holds warm, within bounds that keep priority, fair order, LoRA
ranks and waiting time; on fakeredis, a real redis-server and a real Redis Cluster."""

from __future__ import annotations

import time
from typing import Any

from producer.client import Client, Handle
from shared.flows import claim_flow, drive
from shared.keys import Keys
from shared.loras import new_adapter, register_lora
from shared.ops.claim import AFFINITY_MAX_PASSES, Claim, Claimed
from shared.ops.warm import Warm
from shared.replies import text
from shared.scripts import Scripts
from shared.settings import DEFAULT_MODEL
from tests.conftest import as_tenant
from tests.shared.test_scripts import TAG

KEYS = Keys()
SYSTEMS = {name: f"You are the {name} assistant. " * 40 for name in ("tax", "law", "cook")}


def ask(client: Client, system: str, question: str, **kwargs: Any) -> Handle:
    messages = [{"role": "system", "content": SYSTEMS[system]},
                {"role": "user", "content": question}]  # fmt: skip
    return client.submit(messages=messages, **kwargs)


def system_fingerprint(client: Client, handle: Handle) -> str:
    """The fingerprint of the request's system prompt (its first cut)."""
    value = client.redis.hget(KEYS.prefixes(TAG), handle.id)
    assert value is not None
    return text(value).split()[0]


def warm(client: Client, worker: str, fps: list[str], ttl_ms: int = 10_000) -> None:
    call = Warm(TAG, worker, fps).call(KEYS, ttl_ms)
    (reply,) = Scripts(client.redis).send([call])
    assert Warm.parse(reply).num_kept == len(fps)


def claim(
    client: Client,
    n: int = 1,
    worker: str = "w",
    window: int = 16,
    max_lora_rank: int | None = None,
    peers: tuple[str, ...] = (),
) -> list[Claimed]:
    lease_ms = client.settings.lease_ms
    request = Claim(TAG, worker, lease_ms, n, n, max_lora_rank, affinity_window=window,
                    peers=peers)  # fmt: skip
    return drive(Scripts(client.redis), claim_flow(KEYS, client.settings, request, cluster=True))


def ids(claimed: list[Claimed]) -> list[str]:
    return [c.request_id for c in claimed]


def test_fingerprints_are_kept_from_submit_until_the_claim(client: Client) -> None:
    handle = ask(client, "tax", "What is VAT?")
    kept = text(client.redis.hget(KEYS.prefixes(TAG), handle.id) or b"").split()
    same_system = ask(client, "tax", "Another question")
    other = text(client.redis.hget(KEYS.prefixes(TAG), same_system.id) or b"").split()
    assert len(kept) == 2 and kept[0] == other[0] and kept[1] != other[1]
    assert ids(claim(client, 2)) == [handle.id, same_system.id]
    assert client.redis.hlen(KEYS.prefixes(TAG)) == 0


def test_a_warm_match_is_taken_ahead_of_an_older_cold_request(client: Client) -> None:
    cold = ask(client, "law", "Old question")
    hot = ask(client, "tax", "Newer question")
    warm(client, "w", [system_fingerprint(client, hot)])
    [taken] = claim(client)
    assert (taken.request_id, taken.by_affinity) == (hot.id, True)
    # The request passed over counts it; the next plain claim takes it.
    assert text(client.redis.hget(KEYS.passes(TAG), cold.id) or b"").startswith("1:")
    [plain] = claim(client, worker="other")
    assert (plain.request_id, plain.by_affinity) == (cold.id, False)
    assert client.redis.hlen(KEYS.passes(TAG)) == 0


def test_the_longest_warm_fingerprint_wins(client: Client) -> None:
    short = ask(client, "tax", "q1")
    long_ = ask(client, "tax", "q2")
    fps = text(client.redis.hget(KEYS.prefixes(TAG), long_.id) or b"").split()
    warm(client, "w", fps)  # its system prompt and its whole conversation
    assert ids(claim(client)) == [long_.id]
    assert ids(claim(client)) == [short.id]


def test_never_ahead_of_a_higher_priority(client: Client) -> None:
    hot = ask(client, "tax", "normal, warm")
    urgent = ask(client, "law", "high, cold", priority="high")
    warm(client, "w", [system_fingerprint(client, hot)])
    assert ids(claim(client)) == [urgent.id]
    assert ids(claim(client)) == [hot.id]


def test_critical_work_is_never_held_back(client: Client) -> None:
    cold = ask(client, "law", "critical, cold", priority="critical")
    hot = ask(client, "tax", "critical, warm", priority="critical")
    warm(client, "w", [system_fingerprint(client, hot)])
    assert ids(claim(client)) == [cold.id]
    assert client.redis.hlen(KEYS.passes(TAG)) == 0


def test_a_passed_over_request_is_taken_after_its_bound_in_claims(client: Client) -> None:
    cold = ask(client, "law", "waits")
    hot = [ask(client, "tax", f"q{i}") for i in range(AFFINITY_MAX_PASSES + 1)]
    warm(client, "w", [system_fingerprint(client, hot[0])])
    taken = [ids(claim(client))[0] for _ in range(AFFINITY_MAX_PASSES)]
    assert taken == [h.id for h in hot[:AFFINITY_MAX_PASSES]]
    # Passed over AFFINITY_MAX_PASSES times: the next claim takes it, warm match or not.
    assert ids(claim(client)) == [cold.id]


def test_a_passed_over_request_is_taken_after_its_bound_in_time(client: Client) -> None:
    cold = ask(client, "law", "waits")
    hot = [ask(client, "tax", f"q{i}") for i in range(3)]
    warm(client, "w", [system_fingerprint(client, hot[0])])
    request = Claim(TAG, "w", client.settings.lease_ms, 1, 1, max_pass_ms=200)
    flow = claim_flow(KEYS, client.settings, request, cluster=True)
    assert ids(drive(Scripts(client.redis), flow)) == [hot[0].id]
    time.sleep(0.25)
    flow = claim_flow(KEYS, client.settings, request, cluster=True)
    assert ids(drive(Scripts(client.redis), flow)) == [cold.id]


def test_with_no_warm_match_siblings_come_together_and_off_keeps_queue_order(
    client: Client,
) -> None:
    handles = [ask(client, s, "q") for s in ("law", "tax", "cook", "law")]
    warm(client, "w", ["0123456789abcdef"])  # warm, but for nothing queued
    assert ids(claim(client, 2)) == [handles[0].id, handles[3].id]
    warm(client, "w", [system_fingerprint(client, handles[2])])
    assert ids(claim(client, 1, window=0)) == [handles[1].id]  # off: queue order
    assert client.redis.hlen(KEYS.passes(TAG)) == 0  # the one pass went with its claim


def test_a_dead_workers_warm_set_stops_counting(client: Client) -> None:
    cold = ask(client, "law", "first")
    hot = ask(client, "tax", "second")
    warm(client, "w", [system_fingerprint(client, hot)], ttl_ms=100)
    time.sleep(0.2)  # no heartbeat renewed it: the worker is gone
    assert not client.redis.exists(KEYS.warm(TAG, "w"))
    assert ids(claim(client)) == [cold.id]
    # Another worker's warm set is its own: it never steers this one's claims.
    warm(client, "other", [system_fingerprint(client, hot)])
    assert ids(claim(client)) == [hot.id]


def test_lora_ranks_still_hold(client: Client) -> None:
    register_lora(client.redis, KEYS, new_adapter(DEFAULT_MODEL, "wide", "/a/wide", 32))
    cold = ask(client, "law", "base")
    hot = ask(client, "tax", "adapter", lora="wide")
    warm(client, "w", [system_fingerprint(client, hot)])
    assert ids(claim(client, max_lora_rank=16)) == [cold.id]  # it cannot serve rank 32
    assert ids(claim(client, max_lora_rank=32)) == [hot.id]


def test_fair_order_holds_among_warm_matches(client: Client) -> None:
    def submit(tenant: str, n: int, system: str) -> list[Handle]:
        return [ask(as_tenant(client, tenant), system, f"{tenant}{i}") for i in range(n)]

    a_cold, a_hot = submit("a", 2, "law"), submit("a", 4, "tax")
    b_hot = submit("b", 2, "tax")
    queued = [text(i) for i in client.redis.zrange(KEYS.queue(TAG), 0, -1)]
    # Each tenant's cache is its own: the worker holds both tenants' system prompt warm.
    warm(client, "w", [system_fingerprint(client, a_hot[0]), system_fingerprint(client, b_hot[0])])
    hot_ids = {h.id for h in a_hot + b_hot}
    # The warm matches come in the queue's (fair) order: b shares the service with a.
    taken = [ids(claim(client))[0] for _ in range(6)]
    assert taken == [i for i in queued if i in hot_ids]
    assert set(taken[:4]) >= {b_hot[0].id, b_hot[1].id}
    assert ids(claim(client, 2)) == [h.id for h in a_cold]
