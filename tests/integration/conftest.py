"""Real processes: worker subprocesses on the default model against our redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from producer.embedded import EmbeddedRedis
from shared.settings import DEFAULT_MODEL

WorkerFactory = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The default model as a local directory (converted from GGUF on first use)."""
    from worker.model_store import resolve_model

    path = resolve_model(DEFAULT_MODEL)
    if not isinstance(path, Path):
        pytest.fail(f"default model did not resolve to a directory: {path!r}")
    return path


@pytest.fixture
def start_worker(
    redis_server: EmbeddedRedis, default_model_dir: Path, tmp_path: Path
) -> Iterator[WorkerFactory]:
    """Starts `tokenq worker` processes; kills whatever is left at teardown."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"worker-{len(procs)}.log").open("wb")
        logs.append(log)
        cmd = [sys.executable, "-m", "producer.cli", "worker", "--redis", redis_server.url,
               "--model", DEFAULT_MODEL, *args]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})  # fmt: skip
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    for log in logs:
        log.close()
