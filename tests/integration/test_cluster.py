"""A real worker process on the default model against a real 3-master Redis Cluster:
cancel and deadlines end streams as they do on one Redis."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster

from producer.client import Client, Handle
from shared.models import FinalEvent, FinishReason, RequestState, StreamEvent, TokenEvent
from shared.settings import DEFAULT_MODEL, Settings
from tests.cluster import LocalCluster
from tests.conftest import serve
from tests.integration.conftest import WorkerFactory
from tests.integration.faults import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LONG = {"max_tokens": 2_000, "ignore_eos": True, "temperature": 0}


def _tokens(events: list[StreamEvent]) -> list[int]:
    tokens = [e.event for e in events if isinstance(e.event, TokenEvent)]
    assert [t.index for t in tokens] == [
        sum(len(u.token_ids) for u in tokens[:i]) for i in range(len(tokens))
    ]
    return [tid for t in tokens for tid in t.token_ids]


def _final(events: list[StreamEvent]) -> FinalEvent:
    assert isinstance(events[-1].event, FinalEvent)
    return events[-1].event


def _started(handle: Handle, min_tokens: int = 1) -> bool:
    status = handle.status()
    return status.state is RequestState.RUNNING and status.num_generated >= min_tokens


def test_cancel_and_deadlines_end_streams_on_a_cluster(
    redis_cluster: LocalCluster, cluster_redis: RedisCluster, start_worker: WorkerFactory
) -> None:
    serve(cluster_redis, DEFAULT_MODEL)  # type: ignore[arg-type]
    client = Client(connection=cluster_redis, settings=Settings())  # type: ignore[arg-type]
    late = client.submit("never runs: its deadline passes before any worker starts", deadline=0.3)
    start_worker("--redis", redis_cluster.url, "--max-num-seqs", "4")
    cancelled = client.submit("Tell me a very long story.", **LONG)
    wait_until(lambda: _started(cancelled, 3), 240, "the long request to stream")
    timed = client.submit("Count to a thousand.", deadline=2.0, **LONG)
    assert cancelled.cancel() == "requested"
    events = list(cancelled.stream(timeout=60))
    assert _final(events).finish_reason is FinishReason.CANCELLED
    assert 3 <= len(_tokens(events)) < 2_000
    timed_events = list(timed.stream(timeout=60))
    assert _final(timed_events).finish_reason is FinishReason.TIMEOUT
    assert 0 < len(_tokens(timed_events)) < 2_000
    assert late.result(timeout=30).finish_reason is FinishReason.EXPIRED
    assert late.status().attempts == 0  # it never ran
