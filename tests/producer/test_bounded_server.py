"""A served app stops on SIGTERM; one whose shutdown hangs, or whose event loop a
request holds, is still gone, with every thread's stack in its log, once the bound
has passed."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from producer.embedded import free_port
from tests.integration.faults import wait_until

pytestmark = pytest.mark.slow

APP = """
import contextlib, pathlib, sys, time
from fastapi import FastAPI
from producer.bounded_server import serve_bounded

port, shutdown, exit_after_s, held = sys.argv[1:]

@contextlib.asynccontextmanager
async def lifespan(app):
    yield
    if shutdown == "hangs":
        time.sleep(3600)  # a shutdown hook that never returns, holding the event loop

app = FastAPI(lifespan=lifespan)

@app.get("/hold")
async def hold():
    pathlib.Path(held).touch()
    time.sleep(3600)  # a blocking call in a handler: the loop never runs again

serve_bounded(app, graceful_s=1, exit_after_s=float(exit_after_s),
              host="127.0.0.1", port=int(port), log_level="info")
"""


def _get(port: int, path: str, timeout_s: float = 2) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s):
            return True
    except OSError:
        return False


def _stopped(
    tmp_path: Path, shutdown: str, exit_after_s: float, hold_loop: bool = False
) -> tuple[int, str, float]:
    """Serve, SIGTERM once up (and, with ``hold_loop``, once a request holds the event
    loop); the exit status, the log and the seconds the stop took."""
    port, held = free_port(), tmp_path / "held"
    cmd = [sys.executable, "-c", APP, str(port), shutdown, str(exit_after_s), str(held)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: _get(port, "/openapi.json"), 60, "the app")
        if hold_loop:
            threading.Thread(target=_get, args=(port, "/hold", 60), daemon=True).start()
            wait_until(held.exists, 60, "the request holding the loop")
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        return proc.returncode, output, time.monotonic() - began
    finally:
        proc.kill()
        proc.wait()


def test_a_healthy_app_stops_on_sigterm_with_no_stacks(tmp_path: Path) -> None:
    code, output, took_s = _stopped(tmp_path, "returns", exit_after_s=30)
    assert code == -signal.SIGTERM, output
    assert "Application shutdown complete" in output
    assert "most recent call first" not in output
    assert took_s < 10, output


def test_a_shutdown_that_hangs_is_ended_with_every_threads_stack_logged(tmp_path: Path) -> None:
    code, output, took_s = _stopped(tmp_path, "hangs", exit_after_s=3)
    assert code == 1, output
    assert "the process ends by 3s" in output
    assert "most recent call first" in output and "in lifespan" in output, output
    assert 3 <= took_s < 30, output


def test_a_request_holding_the_event_loop_cannot_hold_the_stop(tmp_path: Path) -> None:
    code, output, took_s = _stopped(tmp_path, "returns", exit_after_s=3, hold_loop=True)
    assert code == 1, output
    assert "most recent call first" in output and "in hold" in output, output
    assert "Shutting down" not in output  # the loop never ran again: the signal armed it
    assert 3 <= took_s < 30, output
