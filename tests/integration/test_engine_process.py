"""A worker with its engine in a process of its own (``tokenq worker --engine-process``),
with a real redis-server and the default model: its streams equal the in-process
engine's, a cancel ends its request, the child goes when its worker is killed, and a
child that dies takes its worker down in one line (exit 1), after which another
worker resumes what it held. What the engine refuses ends its own request with the
engine's error as in one process (``test_hostile_requests.py`` runs both ways)."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from producer.client import Client
from producer.embedded import free_port
from shared.keys import Keys
from shared.models import FinishReason
from shared.settings import DEFAULT_MODEL
from tests.integration.conftest import FAULT_ENV, WorkerFactory
from tests.integration.faults import audit_stream
from tests.integration.test_hostile_requests import serving
from tests.integration.test_up_signals import descendants

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BODIES: list[dict[str, object]] = [
    {"messages": [{"role": "user", "content": f"Count from 1 to {n}."}], "max_tokens": 24}
    for n in (3, 5, 8, 13)
]


def submit(client: Client, bodies: list[dict[str, object]]) -> list[str]:
    handles = client.submit_many(
        [
            {
                "model": DEFAULT_MODEL,
                "messages": body["messages"],
                "sampling": {
                    "max_tokens": body["max_tokens"],
                    "temperature": 0,
                    "ignore_eos": True,
                },
            }
            for body in bodies
        ]
    )
    return [h.id for h in handles]


def engine_child(worker_pid: int) -> int:
    """The worker's engine process (beside it, multiprocessing's resource tracker)."""
    [child] = [
        pid
        for pid in descendants(worker_pid)
        if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    return child


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    give_up = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < give_up, what
        time.sleep(0.1)


def test_its_streams_equal_the_in_process_engine_and_a_cancel_ends_its_request(
    real_redis: redis.Redis,
    start_worker: WorkerFactory,
    reference: Callable[[list[dict[str, object]]], list[list[int]]],
) -> None:
    port = free_port()
    env = {**FAULT_ENV, "TOKENQ_WORKER_METRICS_PORT": str(port)}
    worker = start_worker("--engine-process", env=env)
    serving(real_redis, worker)
    engine_child(worker.pid)  # the engine runs beside the worker, not in it
    client = Client(connection=real_redis)
    long = client.submit("Write a long story.", max_tokens=2000, temperature=0.0, ignore_eos=True)
    ids = submit(client, BODIES)
    for request_id, expected in zip(ids, reference(BODIES), strict=True):
        client.handle(request_id).result(timeout=120)
        audit = audit_stream(real_redis, request_id)
        assert audit.final is not None and audit.final.finish_reason is FinishReason.LENGTH
        assert audit.indexes_contiguous and audit.duplicated_tokens == 0
        assert audit.token_ids == expected
    long.cancel()
    result = long.result(timeout=60)
    assert result.finish_reason is FinishReason.CANCELLED
    assert 0 < result.usage.completion_tokens < 2000
    assert worker.poll() is None
    # The engine's figures cross the pipe to the worker's metrics; idle, it runs nothing.
    label = f'{{model="{DEFAULT_MODEL}"}}'
    wait_for(lambda: f"tokenq:num_requests_running{label} 0.0" in scrape(port), 10, "still running")
    queried = re.search(rf"tokenq:prefix_cache_queries_total{re.escape(label)} (\S+)", scrape(port))
    assert queried is not None and float(queried.group(1)) > 0


def test_sigterm_drains_what_it_holds_and_stops_its_engine_process(
    real_redis: redis.Redis, start_worker: WorkerFactory
) -> None:
    worker = start_worker("--engine-process", env=FAULT_ENV)
    serving(real_redis, worker)
    children = descendants(worker.pid)
    client = Client(connection=real_redis)
    ids = submit(client, BODIES)
    wait_for(lambda: real_redis.xlen(Keys().stream(ids[0])) > 0, 120, "no tokens streamed")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0
    for request_id in ids:  # short answers: drained, not handed back
        assert client.handle(request_id).result(timeout=5).finish_reason is FinishReason.LENGTH
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), 20, "orphan")


def test_the_engine_process_goes_with_its_worker(
    real_redis: redis.Redis, start_worker: WorkerFactory
) -> None:
    worker = start_worker("--engine-process", env=FAULT_ENV)
    serving(real_redis, worker)
    engine_child(worker.pid)
    children = descendants(worker.pid)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), 20, "orphan")


def test_a_dead_engine_process_takes_its_worker_down_and_another_resumes_its_requests(
    real_redis: redis.Redis, start_worker: WorkerFactory, tmp_path: Path
) -> None:
    doomed = start_worker("--engine-process", env=FAULT_ENV)
    serving(real_redis, doomed)
    client = Client(connection=real_redis)
    ids = submit(client, BODIES)
    wait_for(lambda: real_redis.xlen(Keys().stream(ids[0])) > 0, 120, "no tokens streamed")
    os.kill(engine_child(doomed.pid), signal.SIGKILL)
    assert doomed.wait(timeout=30) == 1
    log = (tmp_path / "worker-0.log").read_text()
    assert "error: the engine process exited (code -9)" in log, log
    assert "Traceback" not in log, log
    start_worker(env=FAULT_ENV)  # one process: resumes what the dead worker held
    for request_id in ids:
        result = client.handle(request_id).result(timeout=180)
        assert result.finish_reason is FinishReason.LENGTH
        audit = audit_stream(real_redis, request_id)
        assert audit.indexes_contiguous and audit.duplicated_tokens == 0
