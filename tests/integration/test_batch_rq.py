"""Batches on real RQ worker processes and a real redis-server, with a scripted tokenq
worker: completion, cancel midway, and an RQ worker SIGKILLed mid-batch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from producer.batch.models import BatchState
from producer.batch.ops import Batches
from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.keys import Keys, model_tag
from shared.settings import Settings
from tests.conftest import serve
from tests.producer.batch.conftest import MODEL, jsonl
from tests.producer.batch.procs import RqWorkers, rq_batch_settings, tokenq_worker, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def rq_workers(redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[RqWorkers]:
    workers = RqWorkers(redis_server.url, tmp_path)
    yield workers
    workers.stop_all()


@pytest.fixture
def batches(redis_server: EmbeddedRedis, real_redis: redis.Redis) -> Batches:
    serve(real_redis, MODEL)
    client = Client(connection=real_redis, settings=Settings(redis_url=redis_server.url))
    return Batches(client, rq_batch_settings())


def custom_ids(lines: list[bytes]) -> list[str]:
    return [orjson.loads(line)["custom_id"] for line in lines]


def ended(batches: Batches, batch_id: str) -> bool:
    return batches.status(batch_id).state.terminal


def test_a_200_line_batch_completes_with_outputs_by_custom_id(
    batches: Batches, rq_workers: RqWorkers, redis_server: EmbeddedRedis
) -> None:
    rq_workers.start("--no-scheduler")
    with tokenq_worker(redis_server.url, MODEL):
        batch_id = batches.submit(jsonl(200))
        wait_for(lambda: ended(batches, batch_id), 60, "the batch to end")
    status = batches.status(batch_id)
    assert (status.state, status.counts.completed, status.counts.failed) == (
        BatchState.COMPLETED,
        200,
        0,
    )
    outputs, errors = batches.results(batch_id)
    assert custom_ids(outputs) == [f"line-{i}" for i in range(200)]
    assert errors == []
    contents = {
        orjson.loads(o)["response"]["body"]["choices"][0]["message"]["content"] for o in outputs
    }
    assert contents == {"t0t1t2"}


def test_a_batch_cancelled_midway_stops_its_queued_lines(
    batches: Batches, rq_workers: RqWorkers, redis_server: EmbeddedRedis, real_redis: redis.Redis
) -> None:
    rq_workers.start("--no-scheduler")
    with tokenq_worker(redis_server.url, MODEL, step_s=0.01) as engine:
        batch_id = batches.submit(jsonl(200, max_tokens=5))
        wait_for(lambda: batches.status(batch_id).counts.completed >= 10, 30, "some lines done")
        batches.cancel(batch_id)
        queue = Keys().queue(model_tag(MODEL))
        # At once, but a driver round that read the batch just before may still add a
        # few lines; its next round (one poll later) cancels them.
        wait_for(lambda: real_redis.zcard(queue) == 0, 2, "the queued lines to be removed")
        wait_for(lambda: ended(batches, batch_id), 30, "the batch to end")
        num_run = len(engine.added)
    status = batches.status(batch_id)
    assert status.state is BatchState.CANCELLED
    assert 10 <= status.counts.completed < 200
    assert status.counts.completed + status.counts.failed == 200
    assert num_run < 200
    outputs, errors = batches.results(batch_id)
    codes = {orjson.loads(e)["error"]["code"] for e in errors}
    assert codes <= {"cancelled", "batch_cancelled"}
    assert len(outputs) == status.counts.completed


def test_a_batch_survives_its_rq_worker_being_killed_and_no_line_runs_twice(
    batches: Batches, rq_workers: RqWorkers, redis_server: EmbeddedRedis
) -> None:
    first = rq_workers.start("--no-scheduler")
    with tokenq_worker(redis_server.url, MODEL, step_s=0.01) as engine:
        batch_id = batches.submit(jsonl(200))
        wait_for(lambda: batches.status(batch_id).counts.done >= 30, 30, "some lines done")
        rq_workers.kill(first)
        done_at_kill = batches.status(batch_id).counts.done
        rq_workers.start("--no-scheduler")
        wait_for(lambda: ended(batches, batch_id), 60, "the batch to end after the restart")
        added = list(engine.added)
    assert done_at_kill < 200
    status = batches.status(batch_id)
    assert (status.state, status.counts.completed) == (BatchState.COMPLETED, 200)
    outputs, _ = batches.results(batch_id)
    assert custom_ids(outputs) == [f"line-{i}" for i in range(200)]
    request_ids = [orjson.loads(o)["response"]["request_id"] for o in outputs]
    assert len(set(request_ids)) == 200
    assert sorted(added) == sorted(request_ids)  # each line ran exactly once
