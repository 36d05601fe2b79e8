"""Real processes for batch integration tests: RQ workers (subprocesses that can be
SIGKILLed whole) and a scripted tokenq worker in a thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from shared.connection import connect
from shared.settings import Settings
from tests.worker.fakes import ScriptedEngine
from worker.engine import RequestOutput
from worker.service import WorkerService

SECRET = "integration-secret"
RQ_ENV = {
    "TOKENQ_BATCH_TICK_S": "0.5",
    "TOKENQ_BATCH_POLL_S": "0.05",
    "TOKENQ_BATCH_JOB_TIMEOUT_S": "2",
    "TOKENQ_BATCH_HEARTBEAT_GRACE_S": "1",
    "TOKENQ_RQ_MAINTENANCE_S": "1",
    "TOKENQ_BATCH_MAX_IN_FLIGHT": "16",
    "TOKENQ_WEBHOOK_SECRET": SECRET,
    "TOKENQ_WEBHOOK_RETRY_S": "[1, 1]",
    "TOKENQ_WEBHOOK_TIMEOUT_S": "5",
    "PYTHONUNBUFFERED": "1",
}


def rq_batch_settings() -> Settings:
    """The settings the RQ workers run with (the submitter's choose the first job's timeout)."""
    prefix = "TOKENQ_"
    values: dict[str, Any] = {
        k.removeprefix(prefix).lower(): v for k, v in RQ_ENV.items() if k.startswith(prefix)
    }
    values["webhook_retry_s"] = orjson.loads(values["webhook_retry_s"])
    return Settings(**values)


def wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout_s``."""
    give_up = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)
    return value


@dataclass
class SlowEngine(ScriptedEngine):
    """The scripted engine with a pause per step, so a batch is still running mid-test."""

    step_s: float = 0.0

    def step(self) -> list[RequestOutput]:
        if self.step_s:
            time.sleep(self.step_s)
        return super().step()


@contextmanager
def tokenq_worker(url: str, model: str, step_s: float = 0.0) -> Iterator[SlowEngine]:
    """A scripted tokenq worker serving ``model`` in a thread until the block ends."""
    engine = SlowEngine(max_num_seqs=8, step_s=step_s)
    service = WorkerService(engine, connect(url), Settings(redis_url=url), model, "w1")
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        service.stopping.set()
        thread.join(timeout=10)


class RqWorkers:
    """Starts ``tokenq batch worker`` processes, each in its own process group."""

    def __init__(self, url: str, log_dir: Path, **env: str) -> None:
        self.url, self.log_dir, self.env = url, log_dir, env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"rq-{len(self.procs)}.log").open("wb")
        cmd = [sys.executable, "-m", "producer.batch.cli", "worker", "--redis", self.url, *args]
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **RQ_ENV, **self.env},
            start_new_session=True,
        )
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker and everything it started (its scheduler too)."""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)
        for log in self.logs:
            log.close()
