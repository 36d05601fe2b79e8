"""renew_owned.lua: the lease keeper's renewal of every lease a worker holds, found by
its id, on fakeredis, a real redis-server and a real Redis Cluster."""

from __future__ import annotations

import redis

from producer.client import Client
from shared.flows import claim_flow, drive
from shared.keys import Keys, model_tag
from shared.ops.claim import Claim, Claimed
from shared.ops.renew import RenewOwned
from shared.scripts import Scripts
from shared.settings import Settings

MODEL = "SmolLM2-135M-Instruct"
TAG = model_tag(MODEL)


def claim(r: redis.Redis, settings: Settings, n: int, worker: str) -> list[Claimed]:
    flow = claim_flow(Keys(), settings, Claim(TAG, worker, settings.lease_ms, n, n), cluster=True)
    return drive(Scripts(r), flow)


def test_it_renews_every_lease_of_that_worker_and_no_other(client: Client) -> None:
    for i in range(5):
        client.submit(f"p{i}")
    # "w1:x" and "w" share a start with "w1"; only w1's own tokens are its.
    r, settings = client.redis, client.settings
    mine = claim(r, settings, 3, "w1")
    others = claim(r, settings, 1, "w1:x") + claim(r, settings, 1, "w")
    leases = Keys().leases(TAG)
    client.redis.zadd(leases, {c.request_id: 1 for c in [*mine, *others]}, xx=True)  # lapsed
    call = RenewOwned(TAG, "w1").call(Keys(), client.settings.lease_ms)
    assert RenewOwned.parse(Scripts(client.redis).run(call)) == 3
    now_ms = int(client.redis.time()[0]) * 1000
    for c in mine:
        assert (client.redis.zscore(leases, c.request_id) or 0) > now_ms
    for c in others:
        assert client.redis.zscore(leases, c.request_id) == 1


def test_a_settled_request_gets_no_lease_back(client: Client) -> None:
    client.submit("p")
    (c,) = claim(client.redis, client.settings, 1, "w1")
    client.redis.zrem(Keys().leases(TAG), c.request_id)  # settled: its lease dropped...
    call = RenewOwned(TAG, "w1").call(Keys(), client.settings.lease_ms)
    assert RenewOwned.parse(Scripts(client.redis).run(call)) == 0  # ...and not renewed
    assert client.redis.zscore(Keys().leases(TAG), c.request_id) is None
