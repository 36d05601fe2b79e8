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

import pytest

from producer.embedded import free_port
from tests.integration.faults import wait_until

pytestmark = pytest.mark.slow

APP = """
import contextlib, sys, time
from fastapi import FastAPI
from producer.bounded_server import serve_bounded

@contextlib.asynccontextmanager
async def lifespan(app):
    yield
    if sys.argv[2] == "hangs":
        time.sleep(3600)  # a shutdown hook that never returns, holding the event loop

app = FastAPI(lifespan=lifespan)

@app.get("/hold")
async def hold():
    time.sleep(3600)  # a blocking call in a handler: the loop never runs again

serve_bounded(app, graceful_s=1, exit_after_s=3,
              host="127.0.0.1", port=int(sys.argv[1]), log_level="info")
"""


def _get(port: int, path: str, timeout_s: float = 2) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s):
            return True
    except OSError:
        return False


def _stopped(shutdown: str, hold_loop: bool = False) -> tuple[int, str, float]:
    """Serve, SIGTERM once up (and, with ``hold_loop``, once a request holds the event
    loop); the exit status, the log and the seconds the stop took."""
    port = free_port()
    cmd = [sys.executable, "-c", APP, str(port), shutdown]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: _get(port, "/openapi.json"), 60, "the app")
        if hold_loop:
            threading.Thread(target=_get, args=(port, "/hold", 30), daemon=True).start()
            time.sleep(1)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        return proc.returncode, output, time.monotonic() - began
    finally:
        proc.kill()
        proc.wait()


def test_a_healthy_app_stops_on_sigterm_with_no_stacks() -> None:
    code, output, took_s = _stopped("returns")
    assert code == -signal.SIGTERM, output
    assert "Application shutdown complete" in output
    assert "most recent call first" not in output
    assert took_s < 3, output


def test_a_shutdown_that_hangs_is_ended_with_every_threads_stack_logged() -> None:
    code, output, took_s = _stopped("hangs")
    assert code == 1, output
    assert "the process ends by 3s" in output
    assert "most recent call first" in output and "in lifespan" in output, output
    assert 3 <= took_s < 30, output


def test_a_request_holding_the_event_loop_cannot_hold_the_stop() -> None:
    code, output, took_s = _stopped("returns", hold_loop=True)
    assert code == 1, output
    assert "most recent call first" in output and "in hold" in output, output
    assert "Shutting down" not in output  # the loop never ran again: the signal armed it
    assert 3 <= took_s < 30, output
