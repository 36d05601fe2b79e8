"""A model's requests on a real 3-master Redis Cluster: their keys spread over the masters."""

from __future__ import annotations

from collections import Counter

from redis.cluster import RedisCluster

from producer.client import Client
from shared.flows import claim_flow, drive
from shared.keys import NUM_REQUEST_SLOTS, Keys, model_tag
from shared.models import TokenEvent, dumps
from shared.ops.claim import Claim
from shared.ops.publish import Publish, PublishCode, TokenPublish, slot_of
from shared.scripts import Scripts
from shared.settings import DEFAULT_MODEL, Settings
from tests.conftest import serve


def test_the_requests_of_one_model_spread_over_all_three_masters(
    cluster_redis: RedisCluster,
) -> None:
    serve(cluster_redis, DEFAULT_MODEL)  # type: ignore[arg-type]
    client = Client(connection=cluster_redis, settings=Settings())  # type: ignore[arg-type]
    handles = client.submit_many([{"model": DEFAULT_MODEL, "prompt": "x"}] * 600)
    keys = Keys()
    masters = Counter(
        cluster_redis.get_node_from_key(keys.stream(h.id)).name  # type: ignore[no-untyped-call]
        for h in handles
    )
    assert len(masters) == 3
    assert all(abs(n - 200) <= 40 for n in masters.values()), masters
    hashes = Counter(
        cluster_redis.get_node_from_key(keys.request(h.id)).name  # type: ignore[no-untyped-call]
        for h in handles
    )
    assert hashes == masters  # a request's hash and stream share its slot
    assert all(h.status().position is not None for h in handles[:5])


def test_a_step_of_many_requests_publishes_one_call_per_slot(cluster_redis: RedisCluster) -> None:
    serve(cluster_redis, DEFAULT_MODEL)  # type: ignore[arg-type]
    settings = Settings()
    client = Client(connection=cluster_redis, settings=settings)  # type: ignore[arg-type]
    ids = [h.id for h in client.submit_many([{"model": DEFAULT_MODEL, "prompt": "x"}] * 300)]
    keys, scripts = Keys(), Scripts(cluster_redis)
    claim = Claim(model_tag(DEFAULT_MODEL), "w1", settings.lease_ms, len(ids), len(ids))
    claimed = drive(scripts, claim_flow(keys, settings, claim, cluster=True))
    assert sorted(c.request_id for c in claimed) == sorted(ids)
    claimed.sort(key=lambda c: slot_of(c.request_id))  # as a worker's step does
    event = dumps(TokenEvent(index=0, token_ids=(7,), text="a"))
    events = [TokenPublish(c.request_id, c.lease_token, event, 0, 1) for c in claimed]
    publish = Publish(events)
    calls = publish.calls(keys, settings.result_ttl_s, cluster=True)
    assert len(calls) == len({slot_of(i) for i in ids}) <= NUM_REQUEST_SLOTS < len(ids)
    codes = [w.code for w in publish.parse(scripts.send(calls))]
    assert codes == [PublishCode.PUBLISHED] * len(ids)  # one code per event, in the events' order
    assert all(cluster_redis.xlen(keys.stream(c.request_id)) == 1 for c in claimed[:20])
