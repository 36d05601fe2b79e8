"""A model's requests on a real 3-master Redis Cluster: their keys spread over the masters."""

from __future__ import annotations

from collections import Counter

from redis.cluster import RedisCluster

from producer.client import Client
from shared.keys import Keys
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
