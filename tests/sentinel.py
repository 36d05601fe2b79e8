"""A real Redis primary with replicas and three sentinels on free loopback ports, for
tests that kill the primary (or a replica) and watch Sentinel promote a replica."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from producer.embedded import free_port

SHIPPED_CONFIG = str(Path(__file__).parents[1] / "deploy" / "redis.conf")
NUM_SENTINELS = 3
QUORUM = 2


@dataclass
class LocalSentinel:
    """``num_replicas`` replicas of one primary, watched by three sentinels that agree a
    primary is down after ``down_after_ms`` (small on loopback, so a failover takes a
    second or two)."""

    num_replicas: int = 1
    service: str = "tokenq"
    down_after_ms: int = 1000
    data_ports: list[int] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)
    _procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    _dir: str = ""

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}"

    def start(self) -> LocalSentinel:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> LocalSentinel:
        self._dir = tempfile.mkdtemp(prefix="tokenq-sentinel-")
        self.data_ports = [free_port() for _ in range(1 + self.num_replicas)]
        primary = self.data_ports[0]
        for port in self.data_ports:
            self._start_data(port, None if port == primary else primary)
        self._wait_for_replicas(primary, self.num_replicas)
        self.sentinel_ports = [free_port() for _ in range(NUM_SENTINELS)]
        for port in self.sentinel_ports:
            self._start_sentinel(port, primary)
        _retry(lambda: self._sentinels_agree(primary), 30, "the sentinels to see every node")
        return self

    def _start_data(self, port: int, primary: int | None) -> None:
        workdir = Path(self._dir) / f"node-{port}"
        workdir.mkdir()
        # A copy: Sentinel has the nodes rewrite their config file as it reconfigures them.
        config = workdir / "redis.conf"
        shutil.copy(SHIPPED_CONFIG, config)
        args = ["redis-server", str(config), "--port", str(port), "--bind", "127.0.0.1"]
        args += ["--dir", str(workdir)]
        if primary is not None:
            args += ["--replicaof", "127.0.0.1", str(primary)]
        self._procs[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        _retry(lambda: _ping(port), 10, f"redis-server on {port}")

    def _start_sentinel(self, port: int, primary: int) -> None:
        conf = Path(self._dir) / f"sentinel-{port}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self._dir}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {primary} {QUORUM}\n"
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
            f"sentinel failover-timeout {self.service} 10000\n"
            f"sentinel parallel-syncs {self.service} 1\n"
        )
        self._procs[port] = subprocess.Popen(
            ["redis-server", str(conf), "--sentinel"], stdout=subprocess.DEVNULL
        )
        _retry(lambda: _ping(port), 10, f"sentinel on {port}")

    def _wait_for_replicas(self, primary: int, n: int) -> None:
        def synced() -> bool:
            info = redis.Redis(port=primary).info("replication")
            return sum(1 for k, v in info.items() if k.startswith("slave") and
                       isinstance(v, dict) and v.get("state") == "online") >= n  # fmt: skip

        _retry(synced, 30, f"{n} replica(s) in sync")

    def _sentinels_agree(self, primary: int) -> bool:
        for port in self.sentinel_ports:
            state: Any = redis.Redis(port=port).sentinel_master(self.service)
            seen = int(state["num-slaves"]) >= self.num_replicas
            if int(state["port"]) != primary or not seen or state["num-other-sentinels"] < 2:
                return False
        return True

    def primary_port(self) -> int:
        """Where the sentinels say the primary is now."""
        return self._primary_by(self.sentinel_ports[0])

    def kill(self, port: int) -> None:
        """SIGKILL the redis-server on ``port`` (it stays dead)."""
        proc = self._procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    @contextmanager
    def paused(self, port: int) -> Iterator[None]:
        """The redis-server on ``port`` stopped (SIGSTOP: connected, answering nothing)
        while the block runs."""
        proc = self._procs[port]
        proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGCONT)

    def wait_for_failover(self, old_primary: int, timeout_s: float = 30) -> int:
        """The new primary's port, once every sentinel names it and it says it is one."""

        def promoted() -> bool:
            ports = {self._primary_by(p) for p in self.sentinel_ports}
            if len(ports) != 1 or old_primary in ports:
                return False
            role: Any = redis.Redis(port=ports.pop()).info("replication")["role"]
            return bool(role == "master")

        _retry(promoted, timeout_s, "Sentinel to promote a replica")
        return self.primary_port()

    def _primary_by(self, sentinel_port: int) -> int:
        sentinel = redis.Redis(port=sentinel_port)
        address: Any = sentinel.sentinel_get_master_addr_by_name(self.service)
        return int(address[1])

    def stop(self) -> None:
        for proc in self._procs.values():
            proc.terminate()
        for proc in self._procs.values():
            proc.wait(timeout=10)
        self._procs.clear()
        shutil.rmtree(self._dir, ignore_errors=True)


def _ping(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def _retry(check: object, timeout_s: float, what: str) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        try:
            if check():  # type: ignore[operator]
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}")
