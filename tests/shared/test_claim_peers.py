"""Prefix affinity across workers (claim.lua, warm.lua): a request that a peer holds
warmer is left to that peer within the pass-over bound, what a worker claims is warm for
it at once, and each worker learns its peers from warm.lua; on fakeredis, a real
redis-server and a real Redis Cluster."""

from __future__ import annotations

import time

import pytest

from producer.client import Client
from shared.keys import Keys
from shared.ops.claim import AFFINITY_MAX_PASSES
from shared.ops.warm import Warm
from shared.replies import text
from shared.scripts import Scripts
from tests.shared.test_claim_affinity import ask, claim, ids, system_fingerprint, warm
from tests.shared.test_scripts import TAG

KEYS = Keys()


def warm_set(client: Client, worker: str) -> set[str]:
    return {text(fp) for fp in client.redis.smembers(KEYS.warm(TAG, worker))}


def test_a_request_warm_on_a_peer_is_left_to_it(client: Client) -> None:
    theirs = ask(client, "tax", "the peer holds this one")
    cold = ask(client, "law", "nobody holds this one")
    warm(client, "peer", [system_fingerprint(client, theirs)])
    [taken] = claim(client, peers=("peer",))
    assert taken.request_id == cold.id
    assert text(client.redis.hget(KEYS.passes(TAG), theirs.id) or b"").startswith("1:")
    assert ids(claim(client, worker="peer")) == [theirs.id]


def test_a_request_left_to_a_peer_is_taken_after_its_bound(client: Client) -> None:
    theirs = ask(client, "tax", "waits for its peer")
    warm(client, "peer", [system_fingerprint(client, theirs)])
    # Nothing else to take: the room stays unfilled while the peer may still take it.
    for _ in range(AFFINITY_MAX_PASSES):
        assert claim(client, peers=("peer",)) == []
    assert ids(claim(client, peers=("peer",))) == [theirs.id]


def test_a_request_warm_on_both_is_taken(client: Client) -> None:
    shared = ask(client, "tax", "both hold its system prompt")
    fp = system_fingerprint(client, shared)
    warm(client, "w", [fp])
    warm(client, "peer", [fp])
    assert ids(claim(client, peers=("peer",))) == [shared.id]


def test_a_longer_match_on_the_peer_wins(client: Client) -> None:
    theirs = ask(client, "tax", "the peer holds the whole conversation")
    fps = text(client.redis.hget(KEYS.prefixes(TAG), theirs.id) or b"").split()
    warm(client, "w", fps[:1])
    warm(client, "peer", fps)
    assert claim(client, peers=("peer",)) == []


def test_lower_priority_work_waits_while_higher_is_left_to_a_peer(client: Client) -> None:
    high = ask(client, "tax", "high, the peer's", priority="high")
    normal = ask(client, "law", "normal, cold")
    warm(client, "peer", [system_fingerprint(client, high)])
    assert claim(client, 2, peers=("peer",)) == []
    assert ids(claim(client, 2, worker="peer")) == [high.id, normal.id]


def test_critical_work_is_never_left_to_a_peer(client: Client) -> None:
    urgent = ask(client, "tax", "critical, the peer's", priority="critical")
    warm(client, "peer", [system_fingerprint(client, urgent)])
    assert ids(claim(client, peers=("peer",))) == [urgent.id]


def test_a_dead_peers_warm_set_stops_counting(client: Client) -> None:
    theirs = ask(client, "tax", "its worker died")
    warm(client, "peer", [system_fingerprint(client, theirs)], ttl_ms=100)
    time.sleep(0.2)
    assert ids(claim(client, peers=("peer",))) == [theirs.id]


def test_what_a_worker_claims_is_warm_for_it_at_once(client: Client) -> None:
    first = ask(client, "tax", "first of its system prompt")
    sibling = ask(client, "tax", "second of the same")
    other = ask(client, "law", "another system prompt")
    assert ids(claim(client, worker="a")) == [first.id]
    assert system_fingerprint(client, sibling) in warm_set(client, "a")
    assert 0 < client.redis.pttl(KEYS.warm(TAG, "a")) <= client.settings.lease_ms
    # Before any heartbeat of "a": "b" leaves the sibling to it and takes the other.
    assert ids(claim(client, worker="b", peers=("a",))) == [other.id]
    assert ids(claim(client, worker="a", peers=("b",))) == [sibling.id]


def test_with_affinity_off_peers_change_nothing(client: Client) -> None:
    theirs = ask(client, "tax", "the peer's, first in the queue")
    ask(client, "law", "cold")
    warm(client, "peer", [system_fingerprint(client, theirs)])
    assert ids(claim(client, window=0, peers=("peer",))) == [theirs.id]
    assert not client.redis.exists(KEYS.warm(TAG, "w"))
    assert client.redis.hlen(KEYS.passes(TAG)) == 0


def test_warm_names_the_live_peers(client: Client) -> None:
    def publish(worker: str, ttl_ms: int = 10_000) -> list[str]:
        (reply,) = Scripts(client.redis).send([Warm(TAG, worker, ["ab"]).call(KEYS, ttl_ms)])
        return Warm.parse(reply).peers

    assert publish("a") == []
    publish("gone", ttl_ms=100)
    assert sorted(publish("b")) == ["a", "gone"]
    time.sleep(0.2)
    assert publish("a") == ["b"]


def test_cold_requests_come_with_their_siblings(client: Client) -> None:
    law = [ask(client, "law", "first law"), ask(client, "law", "second law")]
    tax = ask(client, "tax", "a tax question between them")
    law.append(ask(client, "law", "third law"))
    cook = ask(client, "cook", "the peer's")
    warm(client, "peer", [system_fingerprint(client, cook)])
    # Nothing warm for "w": it takes one new prefix with its siblings, not two.
    assert ids(claim(client, 3, peers=("peer",))) == [h.id for h in law]
    assert ids(claim(client, 1, worker="peer")) == [cook.id]
    assert ids(claim(client, 1, worker="peer")) == [tax.id]


@pytest.mark.parametrize("know_each_other", [True, False])
def test_workers_starting_cold_split_the_prefixes_between_them(
    client: Client, know_each_other: bool
) -> None:
    # Nothing warm anywhere: each takes one prefix with its sibling, where the plain
    # claim would give each worker both prefixes to compute; so too before a worker's
    # heartbeat has named its peers to it (its first claims may come first): what it
    # takes is warm for it at once, and a peer's claim leaves those siblings alone.
    asked = {(s, n): ask(client, s, f"question {n}") for n in range(2) for s in ("tax", "law")}
    tax, law = [[asked[s, n].id for n in range(2)] for s in ("tax", "law")]
    peers_of = {"a": ("b",), "b": ("a",)} if know_each_other else {"a": (), "b": ()}
    assert ids(claim(client, 2, worker="a", peers=peers_of["a"])) == tax
    assert ids(claim(client, 2, worker="b", peers=peers_of["b"])) == law


def test_requests_with_no_shared_prefix_keep_queue_order(client: Client) -> None:
    asked = [client.submit(prompt=f"short prompt {n}") for n in range(4)]
    assert ids(claim(client, 3, peers=("peer",))) == [h.id for h in asked[:3]]
    assert client.redis.hlen(KEYS.passes(TAG)) == 0


def test_due_requests_a_peer_holds_come_after_the_other_due_ones(client: Client) -> None:
    theirs = ask(client, "tax", "due, the peer's")
    cold = ask(client, "law", "due, cold")
    mine = ask(client, "cook", "warm here, not due")
    warm(client, "peer", [system_fingerprint(client, theirs)])
    warm(client, "w", [system_fingerprint(client, mine)])
    now_ms = int(time.time() * 1000)
    client.redis.hset(KEYS.passes(TAG), mapping={h.id: f"{AFFINITY_MAX_PASSES}:{now_ms}"
                                                 for h in (theirs, cold)})  # fmt: skip
    assert ids(claim(client, peers=("peer",))) == [cold.id]
    assert ids(claim(client, peers=("peer",))) == [theirs.id]  # due: not held back
    assert ids(claim(client, peers=("peer",))) == [mine.id]
