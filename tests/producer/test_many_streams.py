"""Thousands of streams followed by one client, on a real redis-server and a real Redis
Cluster: every stream read to its final event, nothing lost or repeated, on a handful of
connections (a blocking read per stream would need one connection each)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import pytest
import redis
from redis.cluster import RedisCluster

from producer.aio import AsyncClient, AsyncHandle
from producer.client import Client, Handle
from producer.following import MAX_LOOKUPS
from shared.connection import close, connect, connect_async, is_cluster
from shared.keys import Keys
from shared.models import FinalEvent, StreamEvent, TokenEvent
from shared.settings import Settings
from tests.producer.gateway.scripted import MODEL, ScriptedWorker, expected_text

NUM_ASYNC = 2_000
NUM_SYNC = 150
NUM_TOKENS = 3
CLIENT_NAME = "many-streams-test"
# Per Redis: the reader, a connection for submits, and the quiet-spell lookups at most.
MAX_CONNECTIONS = 2 + MAX_LOOKUPS


@pytest.fixture(params=["redis-server", "redis-cluster"])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "redis-cluster":
        request.getfixturevalue("cluster_redis")  # flushed
        return str(request.getfixturevalue("redis_cluster").url)
    request.getfixturevalue("real_redis")  # flushed
    return str(request.getfixturevalue("redis_server").url)


@pytest.fixture
def worker(url: str) -> Iterator[ScriptedWorker]:
    settings = Settings(redis_url=url)
    w = ScriptedWorker(url, settings, step_s=0.01, num_tokens=NUM_TOKENS, max_num_seqs=NUM_ASYNC)
    yield w.start()
    w.stop()


def _masters(admin: redis.Redis) -> list[redis.Redis]:
    if not is_cluster(admin):
        return [admin]
    cluster = cast(RedisCluster, admin)
    return [node.redis_connection for node in cluster.get_primaries()]  # type: ignore[no-untyped-call]


def _num_masters(url: str, request_ids: list[str]) -> int:
    """How many masters the streams of these requests live on."""
    admin = connect(url)
    try:
        if not is_cluster(admin):
            return 1
        cluster = cast(RedisCluster, admin)
        keys = [Keys().stream(i) for i in request_ids]
        return len({cluster.get_node_from_key(k).name for k in keys})  # type: ignore[no-untyped-call]
    finally:
        close(admin)


def _named(clients: list[dict[str, str]]) -> int:
    return sum(c.get("name") == CLIENT_NAME for c in clients)


class Peak:
    """The most connections this test's clients hold on any one Redis of ``url`` while
    the block runs, sampled every 50 ms."""

    def __init__(self, url: str) -> None:
        self.most = 0
        self._admin = connect(url)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=10)
        close(self._admin)

    def _watch(self) -> None:
        masters = _masters(self._admin)
        while not self._done.wait(0.05):
            counts = [_named(node.client_list()) for node in masters]
            self.most = max(self.most, *counts)


def _check(events: list[StreamEvent]) -> None:
    tokens = [e.event for e in events if isinstance(e.event, TokenEvent)]
    assert [t.index for t in tokens] == list(range(NUM_TOKENS))
    assert "".join(t.text for t in tokens) == expected_text(NUM_TOKENS)
    assert isinstance(events[-1].event, FinalEvent) and len(events) == NUM_TOKENS + 1
    assert len({e.id for e in events}) == len(events)


BODY = {"model": MODEL, "prompt": "hi", "sampling": {"max_tokens": NUM_TOKENS}}


async def _read(handle: AsyncHandle) -> list[StreamEvent]:
    return [e async for e in handle.stream(timeout=120)]


async def test_one_async_client_follows_2000_streams_to_their_ends_on_a_few_connections(
    url: str, worker: ScriptedWorker
) -> None:
    connection = connect_async(url, client_name=CLIENT_NAME)
    async with AsyncClient(connection=connection, settings=Settings(redis_url=url)) as client:
        handles = await client.submit_many([BODY] * NUM_ASYNC)
        assert _num_masters(url, [h.id for h in handles]) == (3 if "cluster" in url else 1)
        slow, leaver = handles[0].stream(), handles[1].stream()
        first = [await anext(slow)]  # then left unread while the rest are read
        assert isinstance((await anext(leaver)).event, TokenEvent)
        await leaver.aclose()  # stops following after one event
        with Peak(url) as peak:
            everything = await asyncio.gather(*(_read(h) for h in handles[2:]))
        for events in everything:
            _check(events)
        _check(first + [e async for e in slow])
        assert (await handles[1].result(timeout=5)).text == expected_text(NUM_TOKENS)
        assert client._streams().num_subscriptions == 0
    assert 1 <= peak.most <= MAX_CONNECTIONS, peak.most


async def test_an_async_follower_that_breaks_out_stops_being_followed(
    url: str, worker: ScriptedWorker
) -> None:
    worker.num_tokens = 1_000
    async with AsyncClient(settings=Settings(redis_url=url)) as client:
        handle = await client.submit(model=MODEL, prompt="hi", max_tokens=1_000)
        async for _ in handle.stream():
            break
        await asyncio.sleep(0.1)  # the generator is closed on the loop's next turns
        assert client._streams().num_subscriptions == 0
        assert await handle.cancel() == "requested"


def test_one_sync_client_follows_many_streams_from_many_threads_on_a_few_connections(
    url: str, worker: ScriptedWorker
) -> None:
    with Client(connection=connect(url, client_name=CLIENT_NAME), settings=Settings()) as client:
        handles = client.submit_many([BODY] * NUM_SYNC)
        with Peak(url) as peak, ThreadPoolExecutor(NUM_SYNC) as pool:
            everything = list(pool.map(lambda h: list(h.stream(timeout=120)), handles))
        for events in everything:
            _check(events)
        assert _results(handles) == [expected_text(NUM_TOKENS)] * NUM_SYNC
        assert client._streams().num_subscriptions == 0
    assert 1 <= peak.most <= MAX_CONNECTIONS, peak.most


def _results(handles: list[Handle]) -> list[str]:
    return [h.result(timeout=5).text for h in handles]
