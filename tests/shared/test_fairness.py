"""Weighted fair order within a priority (shared.fairness, enqueue/claim/charge.lua),
against fakeredis, a real redis-server and a real Redis Cluster."""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from producer.client import Client
from shared.fairness import FAIR_UNITS_PER_TOKEN, estimated_tokens, excess_tokens, units
from shared.keys import Keys, model_tag
from shared.models import GenerationRequest
from shared.ops.moves import Charge, Settle
from shared.scripts import Scripts
from shared.settings import Settings
from tests.conftest import as_tenant
from tests.shared.test_scripts import MODEL, claim

TAG = model_tag(MODEL)


@pytest.fixture
def fair_client(any_redis: redis.Redis) -> Client:
    from tests.conftest import serve

    serve(any_redis, MODEL)
    return Client(connection=any_redis, settings=Settings(max_queued=5000))


def submit(client: Client, tenant: str, n: int, weight: float = 1.0, **kw: object) -> list[str]:
    reqs = [{"model": MODEL, "prompt": "same size", **kw} for _ in range(n)]
    return [h.id for h in as_tenant(client, tenant, weight).submit_many(reqs)]


def claimed_tenants(client: Client, n: int, owner: dict[str, str]) -> list[str]:
    return [owner[c.request_id] for c in claim(client.redis, client.settings, n)]


def test_a_newcomer_is_served_alongside_a_backlog_not_behind_it(fair_client: Client) -> None:
    owner = dict.fromkeys(submit(fair_client, "a", 200), "a")
    first = claimed_tenants(fair_client, 10, owner)
    owner |= dict.fromkeys(submit(fair_client, "b", 5), "b")
    after = claimed_tenants(fair_client, 10, owner)
    assert first == ["a"] * 10
    assert Counter(after) == {"a": 5, "b": 5}, after  # alternating, not 190 of a first


def test_weights_share_service_3_to_1_and_high_priority_beats_both(fair_client: Client) -> None:
    owner = dict.fromkeys(submit(fair_client, "a", 100, weight=3), "a")
    owner |= dict.fromkeys(submit(fair_client, "b", 100, weight=1), "b")
    owner |= dict.fromkeys(submit(fair_client, "c", 1, priority="high"), "c")
    order = claimed_tenants(fair_client, 41, owner)
    assert order[0] == "c"
    assert Counter(order[1:]) == {"a": 30, "b": 10}


def test_an_idle_tenant_banks_no_credit(fair_client: Client) -> None:
    owner = dict.fromkeys(submit(fair_client, "a", 50), "a")
    claimed_tenants(fair_client, 40, owner)  # b was idle all this time
    owner |= dict.fromkeys(submit(fair_client, "b", 30), "b")
    order = claimed_tenants(fair_client, 20, owner)
    # b comes back level with a's head (they alternate, b first), not ahead of a's
    # remaining 10 for the 40 turns it was away: banked credit would give b all 20.
    assert Counter(order)["a"] in (9, 10)


def test_a_tenants_own_requests_keep_their_order(fair_client: Client) -> None:
    ids = submit(fair_client, "a", 5) + submit(fair_client, "b", 5)
    order = [c.request_id for c in claim(fair_client.redis, fair_client.settings, 10)]
    assert [i for i in order if i in ids[:5]] == ids[:5]
    assert [i for i in order if i in ids[5:]] == ids[5:]


def test_service_beyond_the_estimate_is_charged_to_the_tenant(fair_client: Client) -> None:
    owner = dict.fromkeys(submit(fair_client, "a", 20), "a")
    owner |= dict.fromkeys(submit(fair_client, "b", 20), "b")
    claimed_tenants(fair_client, 2, owner)
    # a's first request turned out to cost 10 requests' worth more than estimated.
    per_request = units(estimated_tokens(GenerationRequest(model=MODEL, prompt="same size")), 1)
    Scripts(fair_client.redis).run(
        Settle(TAG, [], [Charge(50, "a", 10 * per_request)]).call(Keys())
    )
    owner |= dict.fromkeys(submit(fair_client, "a", 5), "a")
    owner |= dict.fromkeys(submit(fair_client, "b", 5), "b")
    order = claimed_tenants(fair_client, 48, owner)
    # a's new work waits behind b's until b has had the service a took.
    assert order[-5:] == ["a"] * 5


def test_fair_state_holds_only_tenants_ahead_of_the_clock(fair_client: Client) -> None:
    owner = dict.fromkeys(submit(fair_client, "busy", 100), "busy")
    for n in range(30):  # one-off tenants, each served while busy's backlog waits
        owner |= dict.fromkeys(submit(fair_client, f"t{n}", 1), "t")
        claimed_tenants(fair_client, 2, owner)
    assert fair_client.redis.zcard(Keys().fair_tags(TAG)) <= 3
    claimed_tenants(fair_client, 100, owner)  # the band runs dry: every tenant is idle
    assert fair_client.redis.zcard(Keys().fair_tags(TAG)) == 0


def test_excess_and_units() -> None:
    req = GenerationRequest(model=MODEL, prompt="x" * 40, sampling={"max_tokens": 100})
    assert estimated_tokens(req) == 10 + 16
    assert excess_tokens(req, 12, 50) == 12 + 50 - 26
    assert excess_tokens(req, 5, 3) == 0
    assert units(3, 1.0) == 3 * FAIR_UNITS_PER_TOKEN and units(3, 3.0) == FAIR_UNITS_PER_TOKEN
    assert units(0, 1.0) == 0


def test_a_bad_weight_is_refused_with_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="tenant_weight 0 is out of range"):
        GenerationRequest(model=MODEL, prompt="x", tenant_weight=0)
    with pytest.raises(ValueError, match="must be a number"):
        GenerationRequest(model=MODEL, prompt="x", tenant_weight="3")
