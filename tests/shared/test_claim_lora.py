"""A worker claims only the LoRA adapter requests it can serve (enqueue.lua marks each
with its adapter's rank, claim.lua leaves a worker those over its rank), on fakeredis,
a real redis-server and a real Redis Cluster."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from producer.admin import Admin
from producer.client import Client, Handle
from shared.flows import claim_flow, drive, fence_flow, retry_flow
from shared.keys import Keys
from shared.loras import new_adapter, register_lora
from shared.models import FinalEvent, FinishReason, LoraAdapter, RequestState
from shared.ops.claim import CLAIM_LOOK_PAST, Claim, Claimed
from shared.ops.moves import Fate, FenceMode, Settle
from shared.ops.publish import Finish
from shared.reaper import reap_once
from shared.replies import text
from shared.scripts import Scripts
from shared.settings import DEFAULT_MODEL, Settings
from tests.conftest import as_tenant
from tests.shared.test_scripts import TAG, publish_token

KEYS = Keys()
BASE_ONLY = 0  # a worker started with --max-loras 0
LORA = 16  # the default --max-lora-rank


@pytest.fixture(autouse=True)
def adapters(client: Client) -> None:
    for name, rank in (("poet", 8), ("wide", 32)):
        register_lora(client.redis, KEYS, new_adapter(DEFAULT_MODEL, name, f"/a/{name}", rank))


def claim(client: Client, n: int, max_lora_rank: int | None, worker: str = "w") -> list[str]:
    """A worker's intake: peek the queue's first ``n`` and claim them with its rank."""
    return [c.request_id for c in _claim(client, n, max_lora_rank, worker)]


def _claim(client: Client, n: int, max_lora_rank: int | None, worker: str) -> list[Claimed]:
    claim = Claim(TAG, worker, client.settings.lease_ms, n, n, max_lora_rank)
    return drive(Scripts(client.redis), claim_flow(KEYS, client.settings, claim, cluster=True))


def mark(client: Client, handle: Handle) -> float | None:
    return client.redis.zscore(KEYS.lora_ranks(TAG), handle.id)


def names(handles: dict[str, Handle], ids: list[str]) -> list[str]:
    by_id = {h.id: name for name, h in handles.items()}
    return [by_id[i] for i in ids]


def test_a_base_only_worker_leaves_adapter_requests_to_a_lora_worker_in_priority_order(
    client: Client,
) -> None:
    plan = [
        ("base-low", "low", None),
        ("poet-high", "high", "poet"),
        ("base-normal", "normal", None),
        ("poet-critical", "critical", "poet"),
        ("base-high", "high", None),
        ("poet-normal", "normal", "poet"),
    ]
    handles = {name: client.submit(name, priority=p, lora=lora) for name, p, lora in plan}
    # Its candidates are the two queue heads, both adapter requests: it takes the next
    # two it can serve instead, by priority, and the adapter requests stay queued.
    assert names(handles, claim(client, 2, BASE_ONLY, "base")) == ["base-high", "base-normal"]
    poet = [handles[n] for n in ("poet-critical", "poet-high", "poet-normal")]
    assert [h.status().state for h in poet] == [RequestState.QUEUED] * 3
    assert [h.position() for h in poet] == [0, 1, 2]
    assert names(handles, claim(client, 2, LORA, "lora")) == ["poet-critical", "poet-high"]
    assert claim(client, 1, BASE_ONLY, "base") == [handles["base-low"].id]
    assert claim(client, 5, BASE_ONLY, "base") == []
    assert claim(client, 5, LORA, "lora") == [handles["poet-normal"].id]
    assert {h.status().worker for h in poet} == {"lora"}


def test_an_adapter_over_the_worker_s_rank_is_left_to_one_whose_rank_covers_it(
    client: Client,
) -> None:
    wide = client.submit("w", lora="wide", priority="high")
    poet = client.submit("p", lora="poet")
    assert (mark(client, wide), mark(client, poet)) == (32, 8)
    assert claim(client, 1, LORA) == [poet.id]
    assert wide.position() == 0
    assert claim(client, 1, 31) == []
    assert claim(client, 1, 32) == [wide.id]


def test_a_worker_that_serves_any_adapter_takes_them_all(client: Client) -> None:
    handles = [client.submit("x", lora=lora) for lora in ("wide", None, "poet")]
    assert claim(client, 3, None) == [h.id for h in handles]


def test_an_entry_queued_before_marks_is_a_base_request(client: Client) -> None:
    old = client.submit("queued by an older gateway", lora="poet", priority="high")
    client.redis.zrem(KEYS.lora_ranks(TAG), old.id)
    base = client.submit("base")
    assert claim(client, 2, BASE_ONLY) == [old.id, base.id]


def test_an_adapter_registered_without_a_rank_needs_a_worker_that_serves_adapters(
    client: Client,
) -> None:
    record = LoraAdapter(name="legacy", model=DEFAULT_MODEL, path="/a/legacy")
    client.redis.hset(KEYS.loras(TAG), "legacy", record.model_dump_json(exclude={"rank"}))
    handle = client.submit("x", lora="legacy")
    assert mark(client, handle) == 1
    assert claim(client, 1, BASE_ONLY) == []
    assert claim(client, 1, 1) == [handle.id]


def test_fair_order_holds_among_what_each_worker_can_claim(client: Client) -> None:
    def submit(tenant: str, n: int, lora: str | None) -> list[Handle]:
        submitter = as_tenant(client, tenant)
        return [submitter.submit(f"{tenant}{i}", lora=lora) for i in range(n)]

    a_base, a_poet = submit("a", 4, None), submit("a", 2, "poet")
    b_base, b_poet = submit("b", 2, None), submit("b", 2, "poet")
    queued = [text(i) for i in client.redis.zrange(KEYS.queue(TAG), 0, -1)]
    base_order = [claim(client, 1, BASE_ONLY, "base")[0] for _ in range(6)]
    lora_order = [claim(client, 1, LORA, "lora")[0] for _ in range(4)]
    # Each worker takes what it can serve in the queue's (fair) order...
    assert base_order == [i for i in queued if i in {h.id for h in a_base + b_base}]
    assert lora_order == [i for i in queued if i in {h.id for h in a_poet + b_poet}]
    # ... so b, arriving behind a's backlog, shares the base-only worker's service with a
    # (a tie in fair order is broken by id), and its adapter requests go before a's,
    # whose base work already took its share of the model.
    assert [set(base_order[:2]), set(base_order[2:4])] == [
        {a_base[0].id, b_base[0].id},
        {a_base[1].id, b_base[1].id},
    ]
    assert base_order[4:] == [a_base[2].id, a_base[3].id]
    assert lora_order == [h.id for h in (*b_poet, *a_poet)]


def test_the_look_past_the_candidates_is_bounded(
    client: Client, make_settings: Callable[..., Settings]
) -> None:
    roomy = Client(connection=client.redis, settings=make_settings(max_queued=1000))
    wall = [{"model": DEFAULT_MODEL, "prompt": "x", "lora": "poet", "priority": "high"}]
    roomy.submit_many(wall * (CLAIM_LOOK_PAST + 1))
    behind = roomy.submit("base")
    assert claim(client, 1, BASE_ONLY) == []  # the one base request is out of its reach
    assert behind.status().state is RequestState.QUEUED
    claim(client, 2, LORA)
    assert claim(client, 1, BASE_ONLY) == [behind.id]


def test_a_resumed_adapter_request_is_replaced_only_by_resumed_work(client: Client) -> None:
    poet = client.submit("p", lora="poet", priority="critical")
    (held,) = _claim(client, 1, LORA, "lora")
    publish_token(client.redis, held, 0, "x")  # a reader is mid-answer: it resumes first
    flow = fence_flow(KEYS, client.settings, TAG, {poet.id: held.lease_token}, FenceMode.RELEASE)
    drive(Scripts(client.redis), flow)
    new = client.submit("base")
    assert poet.position() == 0 and mark(client, poet) == 8  # put back, still marked
    # Peeking only the room it keeps for resumed streams, a base-only worker takes no
    # new work in place of the resumed one it cannot serve.
    assert claim(client, 1, BASE_ONLY) == []
    assert claim(client, 2, BASE_ONLY) == [new.id]
    assert claim(client, 1, LORA) == [poet.id]


def test_the_mark_goes_when_the_request_is_cancelled_expired_or_finished(
    client: Client,
) -> None:
    cancelled = client.submit("c", lora="poet")
    late = client.submit("l", lora="poet", deadline=0.001)
    done = client.submit("d", lora="poet")
    assert cancelled.cancel() == "cancelled"
    time.sleep(0.01)
    reap_once(client.redis, Scripts(client.redis), client.settings, TAG, "reaper")
    assert late.status().state is RequestState.EXPIRED
    (held,) = _claim(client, 1, LORA, "lora")
    assert held.request_id == done.id and mark(client, done) == 8  # kept while it runs
    _end(client, held, "finished")
    assert done.result(timeout=1).finish_reason is FinishReason.LENGTH
    assert client.redis.zcard(KEYS.lora_ranks(TAG)) == 0


def test_a_dead_letter_keeps_its_mark_for_a_retry_and_loses_it_when_purged(
    client: Client,
) -> None:
    first, second = client.submit("1", lora="poet"), client.submit("2", lora="poet")
    for held in _claim(client, 2, LORA, "lora"):
        _end(client, held, "dead")
    assert drive(Scripts(client.redis), retry_flow(KEYS, first.id))
    assert claim(client, 1, BASE_ONLY) == []
    assert claim(client, 1, LORA) == [first.id]
    assert Admin(client).purge() == 1
    assert (mark(client, first), mark(client, second)) == (8, None)


def _end(client: Client, held: Claimed, state: str) -> None:
    if state == "dead":  # as a worker dead-letters one, saying why
        final = FinalEvent(finish_reason=FinishReason.ERROR, error="unreadable")
    else:
        final = FinalEvent(finish_reason=FinishReason.LENGTH)
    output = b'{"text": "", "token_ids": []}'
    finish = Finish(held.request_id, held.lease_token, final, output, Fate(state))
    reply = Scripts(client.redis).run(finish.call(KEYS, client.settings.result_ttl_s))
    finished = finish.parse(reply)
    assert finished is not None
    Scripts(client.redis).run(Settle(TAG, [finished.moved]).call(KEYS))
