"""The lease keeper: a child process that keeps a worker's leases while the worker's own
heartbeat cannot renew them.

Why a process. The heartbeat is a thread, and a thread needs the GIL to run any Python
at all: to loop, to build its Redis call, to read the reply. A step that holds the GIL
(C code that never releases it, such as a grammar compile or a slow tokenizer; or
Python that the interpreter is given no reason to interrupt) starves it, and past a
lease the reaper takes work from a live worker: its stream goes silent, the request
runs again elsewhere and an attempt is counted as "worker lost". A thread that
released the GIL around its Redis call would still need it between calls, and
bounding the loop's stretches would need every library's C code to yield. A process
has an interpreter of its own: nothing the worker runs can starve it of a GIL.

What it does. After each beat that reached Redis the heartbeat writes one line to the
keeper's stdin (nothing is waited for): how long ago the loop last turned. While those
lines come on time the keeper only reads. When one is half a lease late, it renews
every lease the worker holds, found by the worker's id (renew_owned.lua: each lease
token in the model's owners hash starts with its worker's id), so it needs no list of
requests from the worker, only:

- while the worker's process is computing (its CPU time grows: a loop holding the GIL
  burns CPU; a stopped, blocked or dead worker does not, and loses its leases within a
  lease as before);
- while the loop turned within ``TOKENQ_WORKER_STALL_LIMIT_MS``: a loop stuck for good
  loses its leases too, and the heartbeat applies the same bound to its own renewals.

It exits when its stdin ends: the worker stopped, or died.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import IO

import redis

from shared.connection import UNREACHABLE, connect
from shared.keys import Keys
from shared.ops.renew import RenewOwned
from shared.scripts import Scripts
from shared.settings import Settings

log = logging.getLogger(__name__)
READY = b"ready\n"  # the keeper's one line on its stdout


@dataclass(frozen=True)
class Orders:
    """What the keeper is told when it starts (its first line on stdin)."""

    redis_url: str
    redis_cluster: bool
    namespace: str
    lease_ms: int
    stall_limit_ms: int
    tag: str  # the model's
    worker_id: str
    pid: int  # the worker's process


class Verdict(StrEnum):
    ON_TIME = "on_time"  # the worker's heartbeat renews: nothing to do
    KEPT = "kept"  # renewed by the keeper not long ago
    NOT_RUNNING = "not_running"  # the worker's process is not computing
    STALLED = "stalled"  # its loop has not turned within the stall limit
    RENEW = "renew"


@dataclass
class Watch:
    """What the keeper knows of its worker (monotonic seconds, its own clock)."""

    lease_s: float
    stall_limit_s: float
    # When the last line came (the heartbeat's last beat); None before the first: the
    # worker is loading its model, and holds no lease until its heartbeat starts.
    beat_s: float | None = None
    turn_age_s: float = 0.0  # how long before that the loop had turned
    kept_s: float = -float("inf")  # when the keeper last renewed

    def verdict(self, now_s: float, computing: bool) -> Verdict:
        if self.beat_s is None or now_s - self.beat_s < self.lease_s / 2:
            return Verdict.ON_TIME
        if now_s - self.kept_s < self.lease_s / 3:
            return Verdict.KEPT
        if not computing:
            return Verdict.NOT_RUNNING
        if self.turn_age_s + now_s - self.beat_s > self.stall_limit_s:
            return Verdict.STALLED
        return Verdict.RENEW


def cpu_ticks(pid: int) -> int | None:
    """The process's CPU time so far (clock ticks), None when unreadable (not Linux, or
    gone) or when it is stopped (SIGSTOP, a debugger)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in (b"T", b"t", b"Z", b"X"):
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime


class LeaseKeeper:
    """The worker's handle on its keeper process."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        assert process.stdin is not None  # Popen(stdin=PIPE) made it
        self._stdin: IO[bytes] = process.stdin
        os.set_blocking(self._stdin.fileno(), False)  # a stuck keeper never blocks a beat

    @classmethod
    def start(cls, settings: Settings, tag: str, worker_id: str) -> LeaseKeeper:
        orders = Orders(
            settings.redis_url,
            settings.redis_cluster,
            settings.namespace,
            settings.lease_ms,
            settings.worker_stall_limit_ms,
            tag,
            worker_id,
            os.getpid(),
        )
        cmd = [sys.executable, "-m", "worker.lease_keeper"]
        process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert process.stdin is not None
        # On stdin, not in argv: the URL may hold a password.
        process.stdin.write(json.dumps(asdict(orders)).encode() + b"\n")
        process.stdin.flush()
        return cls(process)

    def wait_ready(self, timeout_s: float) -> bool:
        """Until the keeper has read its orders and reached Redis (False: not within
        ``timeout_s``; it keeps starting, and keeps leases once up)."""
        stdout = self.process.stdout
        assert stdout is not None  # Popen(stdout=PIPE) made it
        readable, _, _ = select.select([stdout], [], [], timeout_s)
        ready = bool(readable) and stdout.readline() == READY
        if not ready:
            log.warning("lease keeper not up within %.0fs; serving without it meanwhile", timeout_s)
        return ready

    def beaten(self, turn_age_s: float) -> None:
        """The heartbeat's leases reached Redis; the loop turned ``turn_age_s`` ago."""
        # A keeper that reads no more (or is gone) changes nothing here.
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self._stdin.fileno(), f"{turn_age_s:.3f}\n".encode())

    def stop(self) -> None:
        self._stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Keeper:
    """The child's side: read the heartbeat's lines, renew when they are late."""

    def __init__(self, orders: Orders, scripts: Scripts) -> None:
        self.lease_ms = orders.lease_ms
        self.pid = orders.pid
        renew = RenewOwned(orders.tag, orders.worker_id)
        self.call = renew.call(Keys(orders.namespace), orders.lease_ms)
        stall_limit_s = orders.stall_limit_ms / 1000
        self.watch = Watch(orders.lease_ms / 1000, stall_limit_s)
        self.scripts = scripts
        self.ticks = cpu_ticks(self.pid)
        self.buffer = b""
        self.last = Verdict.ON_TIME

    def run(self, fd: int) -> None:
        tick_s = self.lease_ms / 6000
        while True:
            readable, _, _ = select.select([fd], [], [], tick_s)
            if readable and not self.read(fd):
                return  # the worker closed its end, or died
            if os.getppid() != self.pid:
                return  # the worker died, and a process it forked still holds the pipe
            self.tick(time.monotonic())

    def read(self, fd: int) -> bool:
        data = os.read(fd, 4096)
        if not data:
            return False
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        if lines:
            self.watch.beat_s, self.watch.turn_age_s = time.monotonic(), float(lines[-1])
        return True

    def tick(self, now_s: float) -> None:
        ticks, last = cpu_ticks(self.pid), self.ticks
        self.ticks = ticks
        computing = ticks is not None and last is not None and ticks > last
        verdict = self.watch.verdict(now_s, computing)
        if verdict is not self.last and verdict in SAID:
            log.warning("lease keeper (worker pid %d): %s", self.pid, SAID[verdict])
        self.last = verdict if verdict is not Verdict.KEPT else self.last
        if verdict is Verdict.RENEW:
            self.renew(now_s)

    def renew(self, now_s: float) -> None:
        try:
            num_renewed = RenewOwned.parse(self.scripts.send([self.call])[0])
        except (*UNREACHABLE, redis.RedisError) as e:
            log.warning("lease keeper: renewal failed (%s); retrying", e)
            return
        self.watch.kept_s = now_s
        log.info("lease keeper: renewed %d lease(s)", num_renewed)


# What the keeper says when it comes to a verdict (once, until another).
SAID = {
    Verdict.RENEW: "its heartbeat is late while it computes: renewing its leases",
    Verdict.STALLED: "its loop made no turn within TOKENQ_WORKER_STALL_LIMIT_MS: "
    "its leases are left to lapse",
    Verdict.ON_TIME: "its heartbeat renews again",
}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # A Ctrl-C or a stop sent to the worker's process group is the worker's to act on
    # (it drains, and may stall meanwhile): the keeper ends when the worker does.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    fd = sys.stdin.fileno()
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 1)  # the first line alone: what follows is Keeper.read's
        if not chunk:
            return
        line += chunk
    orders = Orders(**json.loads(line))
    scripts = Scripts(connect(orders.redis_url, orders.redis_cluster))
    with contextlib.suppress(*UNREACHABLE, redis.RedisError):
        scripts.reload()  # now, not in the middle of a stall (it retries on failure then)
    keeper = Keeper(orders, scripts)
    os.write(sys.stdout.fileno(), READY)
    keeper.run(fd)


if __name__ == "__main__":
    main()
