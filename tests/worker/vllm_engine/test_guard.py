"""vLLM's processes die with a worker killed by SIGKILL (the guard kills them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# A stand-in worker: the guard, then a grandchild that, like vLLM's engine core, does not
# watch its parent; it prints the grandchild's pid and waits.
WORKER = """
import subprocess, sys, time
from worker.vllm_engine.guard import start_guard
start_guard()
middle = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; p = subprocess.Popen(['sleep', '600']); "
    "print(p.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
print(middle.stdout.readline().decode().strip(), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.split()[2] != "Z"  # a zombie has died


@pytest.mark.slow
def test_the_workers_descendants_die_when_it_is_killed() -> None:
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert worker.stdout is not None
    grandchild = int(worker.stdout.readline())
    time.sleep(1.5)  # the guard has seen it
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    give_up = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < give_up:
        time.sleep(0.1)
    assert not _alive(grandchild)
