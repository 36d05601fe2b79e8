"""Leases survive a loop that holds the GIL (worker/lease_keeper.py): a real worker
process on a simulated model, a real redis-server, and the fleet's reaper sweeping
from this process the whole time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import redis

from producer.client import Client, Handle
from producer.embedded import EmbeddedRedis
from shared.keys import model_tag
from shared.models import FinishReason, RequestState
from shared.reaper import reap_once
from shared.scripts import Scripts
from shared.settings import Settings
from tests.integration.faults import audit_stream, serving, wait_until

pytestmark = [pytest.mark.integration]

SIM = "sim:step_ms=20"
LEASE_MS = 2000
BUSY_S = 3 * LEASE_MS / 1000  # three lease lengths
ENV = {"TOKENQ_LEASE_MS": str(LEASE_MS), "TOKENQ_WORKER_HEARTBEAT_MS": "400"}
NUM_REQUESTS = 4
BusyWorker = Callable[..., tuple[subprocess.Popen[bytes], Path]]


@pytest.fixture
def busy_worker(redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[BusyWorker]:
    """Starts the worker of tests/integration/busy_worker.py; returns it and its trigger."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(**env: str) -> tuple[subprocess.Popen[bytes], Path]:
        trigger = tmp_path / "busy"
        cmd = [sys.executable, "-m", "tests.integration.busy_worker", "worker"]
        cmd += ["--redis", redis_server.url, "--model", SIM]
        full_env = {**os.environ, **ENV, "BUSY_TRIGGER": str(trigger), "BUSY_S": str(BUSY_S)}
        log = (tmp_path / "worker.log").open("wb")
        procs.append(subprocess.Popen(cmd, env={**full_env, **env}, stdout=log, stderr=log))
        return procs[-1], trigger

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=30)


def run_busy_step(
    real_redis: redis.Redis, worker: subprocess.Popen[bytes], trigger: Path
) -> tuple[list[Handle], int]:
    """Requests mid-stream on ``worker``, then its step holds the GIL for BUSY_S while
    this process sweeps for lapsed leases as every gateway and worker of a fleet does;
    returns the requests once they have all ended, and how many the sweeps put back."""
    wait_until(partial(serving, real_redis, worker.pid), 60, "the worker to serve")
    client = Client(connection=real_redis, settings=Settings())
    handles = [client.submit(f"p{i}", model=SIM, max_tokens=300) for i in range(NUM_REQUESTS)]
    wait_until(lambda: all(h.status().num_generated >= 5 for h in handles), 60, "streams")
    trigger.touch()
    sweep = partial(reap_once, real_redis, Scripts(real_redis), Settings(lease_ms=LEASE_MS))
    num_put_back = 0
    num_after = 20  # sweeps after the step: for a lease past it
    while num_after:
        reaped = sweep(model_tag(SIM), "a-gateway")
        num_put_back += 0 if reaped is None else reaped.requeued + reaped.dead
        num_after -= trigger.with_suffix(".done").exists()
        time.sleep(0.1)
    wait_until(lambda: all(h.status().state.terminal for h in handles), 120, "every end")
    return handles, num_put_back


def test_a_step_holding_the_gil_for_three_leases_keeps_every_lease(
    real_redis: redis.Redis, busy_worker: BusyWorker
) -> None:
    worker, trigger = busy_worker()
    handles, num_put_back = run_busy_step(real_redis, worker, trigger)
    assert num_put_back == 0
    for h in handles:
        status, audit = h.status(), audit_stream(real_redis, h.id)
        assert status.attempts == 1  # started once: never reclaimed, no "worker lost"
        assert status.worker is not None and f"-{worker.pid}-" in status.worker
        assert (status.state, status.num_generated) == (RequestState.FINISHED, 300)
        assert audit.final is not None and audit.final.finish_reason is FinishReason.LENGTH
        assert audit.indexes_contiguous and audit.duplicated_tokens == 0
        assert audit.longest_gap_ms >= BUSY_S * 1000 * 0.9  # the step did hold it all


def test_without_the_keeper_the_same_step_loses_them(
    real_redis: redis.Redis, busy_worker: BusyWorker
) -> None:
    worker, trigger = busy_worker(TOKENQ_WORKER_STALL_LIMIT_MS="0")  # no keeper, no bound
    handles, num_put_back = run_busy_step(real_redis, worker, trigger)
    assert num_put_back == NUM_REQUESTS
    assert all(h.status().attempts == 2 for h in handles)  # "worker lost", started again


def test_a_loop_stuck_past_the_stall_limit_loses_them(
    real_redis: redis.Redis, busy_worker: BusyWorker
) -> None:
    worker, trigger = busy_worker(TOKENQ_WORKER_STALL_LIMIT_MS=str(LEASE_MS))
    handles, num_put_back = run_busy_step(real_redis, worker, trigger)
    # Every lease lapsed, once: the worker then claims its own requests back, and the
    # re-claims keep their leases (worker/ledger.py tells the lapsed runs from the new
    # ones by lease token).
    assert num_put_back == NUM_REQUESTS
    assert all(h.status().attempts == 2 for h in handles)
    for h in handles:
        audit = audit_stream(real_redis, h.id)
        assert h.status().state is RequestState.FINISHED
        assert audit.indexes_contiguous and audit.duplicated_tokens == 0


def test_a_stopped_worker_loses_them_within_a_lease(
    real_redis: redis.Redis, busy_worker: BusyWorker
) -> None:
    worker, _ = busy_worker()
    wait_until(partial(serving, real_redis, worker.pid), 60, "the worker to serve")
    client = Client(connection=real_redis, settings=Settings())
    handles = [client.submit(f"p{i}", model=SIM, max_tokens=300) for i in range(NUM_REQUESTS)]
    wait_until(lambda: all(h.status().num_generated >= 5 for h in handles), 60, "streams")
    worker.send_signal(signal.SIGSTOP)
    stopped_s = time.monotonic()
    sweeps, settings = Scripts(real_redis), Settings(lease_ms=LEASE_MS)
    try:
        while not all(h.status().state is RequestState.QUEUED for h in handles):
            assert time.monotonic() - stopped_s < 3 * LEASE_MS / 1000, "leases kept"
            reap_once(real_redis, sweeps, settings, model_tag(SIM), "a-gateway")
            time.sleep(0.1)
        # Read while it is still stopped: once continued, it may claim them again.
        attempts = [h.status().attempts for h in handles]
    finally:
        worker.send_signal(signal.SIGCONT)
    assert attempts == [1] * NUM_REQUESTS  # back in the queue, once
