"""A watcher that takes vLLM's processes down with the worker.

vLLM runs its engine core (and, past one device, its workers) in processes of its own
that outlive a worker killed with SIGKILL: nothing in them watches their parent. This
watcher, a small process of the worker's, notes the worker's descendants every
``POLL_S`` and, once the worker is gone, kills the last ones it saw. It asks the kernel
to signal it (SIGUSR1) when the worker dies (``PR_SET_PDEATHSIG``), so it acts at once,
and polls the parent as well. It ignores SIGINT and SIGTERM: a Ctrl-C or a stop sent to
the whole process group is the worker's to handle (it drains, and vLLM's processes end
with it).

``python -m worker.vllm_engine.guard WORKER_PID`` (started by :func:`start_guard`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

POLL_S = 0.5
PR_SET_PDEATHSIG = 1


def start_guard() -> subprocess.Popen[bytes]:
    """The watcher of this process's descendants (see the module docs)."""
    cmd = [sys.executable, "-m", "worker.vllm_engine.guard", str(os.getpid())]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, children first (Linux's /proc children lists)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                children = [int(c) for c in task.read_text().split()]
                found += children
                todo += children
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def watch(worker_pid: int) -> None:
    """Until the worker is gone: note its descendants; then kill them."""
    seen: list[int] = []
    me = os.getpid()

    def worker_died(_signum: int, _frame: FrameType | None) -> None:
        kill_all(seen)
        os._exit(0)

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, worker_died)
    with contextlib.suppress(OSError, AttributeError):  # Linux only; polling covers the rest
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGUSR1)
    while os.getppid() == worker_pid:
        seen = [pid for pid in descendants(worker_pid) if pid != me]
        time.sleep(POLL_S)
    kill_all(seen)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
