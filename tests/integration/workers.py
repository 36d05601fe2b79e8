"""Worker processes for the integration tests and the benches built on them: started
with their output in log files, SIGKILLed at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def worker_processes(
    url: str,
    model: str,
    n: int,
    env: dict[str, str],
    log_dir: Path,
    log_name: str = "worker",
    args: tuple[str, ...] = (),
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` `tokenq worker` processes on ``url`` serving ``model``, with ``env`` over
    this process's environment; worker i logs to ``log_dir/{log_name}-{i}.log``."""
    cmd = [sys.executable, "-m", "producer.cli", "worker", "--redis", url, "--model", model]
    full_env = {**os.environ, **env}
    procs, logs = [], []
    try:
        for i in range(n):
            logs.append((log_dir / f"{log_name}-{i}.log").open("wb"))
            procs.append(
                subprocess.Popen(
                    [*cmd, *args], env=full_env, stdout=logs[-1], stderr=subprocess.STDOUT
                )
            )
        yield procs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        for log in logs:
            log.close()
