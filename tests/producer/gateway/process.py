"""The gateway as a real process (``python -m producer.gateway``) for integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from producer.embedded import free_port

START_TIMEOUT_S = 30.0


@contextmanager
def gateway_process(
    redis_url: str, api_keys: str = "", probe: str = "/readyz", **env: str
) -> Iterator[str]:
    """Start a gateway on a free loopback port; yields its base URL once ``probe``
    answers 200; kills it after."""
    with started_gateway(redis_url, api_keys, probe, **env) as (url, _):
        yield url


@contextmanager
def started_gateway(
    redis_url: str, api_keys: str = "", probe: str = "/readyz", **env: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """As ``gateway_process``, also yielding the process (for tests that kill it)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "producer.gateway",
        "--redis",
        redis_url,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "WARNING",
    ]
    environ = {**os.environ, "TOKENQ_API_KEYS": api_keys, **env}
    proc = subprocess.Popen(cmd, env=environ)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url + probe, proc)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"gateway at {url} not ready within {START_TIMEOUT_S}s")
