"""A gateway process and a worker process on the default model, for the unmodified
``openai`` package to talk to."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
import redis

from shared.limits import registered_limits
from shared.settings import DEFAULT_MODEL
from tests.producer.gateway.process import gateway_process

WORKER_ARGS = ("--kv-cache-mib", "64")  # little memory: other tests run beside it


@contextmanager
def openai_stack(
    redis_url: str,
    log_dir: Path,
    model: str = DEFAULT_MODEL,
    served_name: str | None = None,
    **gateway_env: str,
) -> Iterator[openai.OpenAI]:
    """An ``openai.OpenAI`` client on a fresh gateway (``gateway_env`` added to its
    environment) and worker on ``model`` (a name or a path; clients call it
    ``served_name`` when given), its log in ``log_dir``; both are stopped after."""
    redis.Redis.from_url(redis_url).flushall()
    log_path = log_dir / "worker.log"
    cmd = [sys.executable, "-m", "producer.cli", "worker", "--model", model, *WORKER_ARGS]
    cmd += [] if served_name is None else ["--served-model-name", served_name]
    with log_path.open("wb") as log, gateway_process(redis_url, **gateway_env) as url:
        worker = subprocess.Popen([*cmd, "--redis", redis_url], stdout=log, stderr=log)
        try:
            with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0) as c:
                _wait_for_worker(c, served_name or model, worker, log_path)
                wait_for_limits(redis_url, served_name or model)
                yield c
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=30)


def _wait_for_worker(
    c: openai.OpenAI, model: str, worker: subprocess.Popen[bytes], log: Path
) -> None:
    for _ in range(900):
        if worker.poll() is not None:
            pytest.fail(f"the worker exited: {log.read_text()[-2000:]}")
        if [m.id for m in c.models.list()] == [model]:
            return
        time.sleep(0.2)
    pytest.fail("the worker did not register in 180s")


def wait_for_limits(redis_url: str, model: str) -> None:
    """Until the worker serves: it lists its model while it loads, and registers the
    limits that submits are checked against (shared.limits) only once it serves."""
    with redis.Redis.from_url(redis_url) as connection:
        for _ in range(900):
            if registered_limits(connection, model) is not None:
                return
            time.sleep(0.2)
    pytest.fail("the worker did not register its limits in 180s")
