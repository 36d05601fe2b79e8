"""Fixtures: a real redis-server per test session, fakeredis for fast tests,
and factories for settings and clients."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis
from redis.cluster import RedisCluster

from producer.client import Client
from producer.embedded import EmbeddedRedis
from producer.submit import Submitter
from shared.connection import close
from shared.keys import Keys
from shared.registry import mark_served
from shared.settings import DEFAULT_MODEL, Settings
from tests.cluster import LocalCluster


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    """Our own redis-server on a free loopback port (the one on 6379 may be shared)."""
    server = EmbeddedRedis().start()
    if server.kind != "redis-server":
        server.stop()
        pytest.fail("redis-server is not installed: run  apt-get install -y redis-server")
    yield server
    server.stop()


@pytest.fixture
def real_redis(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A real 3-master Redis Cluster on free loopback ports."""
    if not shutil.which("redis-server"):
        pytest.fail("redis-server is not installed: run  apt-get install -y redis-server")
    cluster = LocalCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster_redis(redis_cluster: LocalCluster) -> Iterator[RedisCluster]:
    client = redis_cluster.client()
    client.flushall()
    yield client
    close(client)


@pytest.fixture
def fake_redis() -> Iterator[fakeredis.FakeRedis]:
    client = fakeredis.FakeRedis()
    yield client
    client.close()


REDIS_FIXTURES = {
    "fakeredis": "fake_redis",
    "redis-server": "real_redis",
    "redis-cluster": "cluster_redis",
}


@pytest.fixture(params=list(REDIS_FIXTURES))
def any_redis(request: pytest.FixtureRequest) -> redis.Redis:
    """Runs a test against fakeredis, a real redis-server and a real Redis Cluster."""
    client: redis.Redis = request.getfixturevalue(REDIS_FIXTURES[request.param])
    return client


@pytest.fixture
def make_settings() -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        return Settings(**overrides)

    return make


def serve(connection: redis.Redis, *models: str) -> None:
    """Mark models as served, as a worker's heartbeat does, so submits accept them."""
    pipe = connection.pipeline()
    for model in models:
        mark_served(pipe, Keys(), Settings(), model)
    pipe.execute()


@pytest.fixture
def client(any_redis: redis.Redis, make_settings: Callable[..., Settings]) -> Client:
    serve(any_redis, DEFAULT_MODEL, "m")
    return Client(connection=any_redis, settings=make_settings(max_queued=50))


def as_tenant(client: Client, tenant: str, weight: float = 1.0) -> Client:
    """``client``'s connection and settings, submitting as ``tenant`` (as a trusted
    service naming its own tenant does); not to be closed (the connection is shared)."""
    submitter = Submitter(tenant, weight)
    return Client(connection=client.redis, settings=client.settings, submitter=submitter)
