"""A real Redis Cluster of three masters (with replicas, if asked) on free loopback
ports, for tests."""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass, field

from redis.cluster import RedisCluster

NUM_MASTERS = 3
# A node also listens on port + 10000 (the cluster bus), so stay below 55535.
PORT_RANGE = (20000, 55000)


def _is_free(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_ports(n: int) -> list[int]:
    """``n`` ports whose bus ports (port + 10000) are free too."""
    ports: list[int] = []
    while len(ports) < n:
        port = random.randint(*PORT_RANGE)
        if port not in ports and _is_free(port) and _is_free(port + 10000):
            ports.append(port)
    return ports


@dataclass
class LocalCluster:
    """``num_replicas`` replicas per master; a master is taken for failed, and a
    replica promoted, after ``node_timeout_ms``."""

    num_replicas: int = 0
    node_timeout_ms: int = 5000
    ports: list[int] = field(default_factory=list)
    _procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    _dir: str = ""

    def __post_init__(self) -> None:
        if not self.ports:
            self.ports = free_cluster_ports(NUM_MASTERS * (1 + self.num_replicas))

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` URL of one node (any node finds the rest)."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    @property
    def node_url(self) -> str:
        """A node that is up (any node finds the rest)."""
        live = [p for p in self.ports if p in self._procs] or self.ports
        return f"redis://127.0.0.1:{live[0]}"

    def start(self) -> LocalCluster:
        self._dir = tempfile.mkdtemp(prefix="tokenq-cluster-")
        for port in self.ports:
            self._procs[port] = subprocess.Popen(self._node_args(port), stdout=subprocess.DEVNULL)
        self._wait_for_nodes()
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        replicas = str(self.num_replicas)
        create = ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", replicas]
        subprocess.run([*create, "--cluster-yes"], check=True, capture_output=True, timeout=60)
        self._wait_for_ok()
        return self

    def _node_args(self, port: int) -> list[str]:
        return [
            "redis-server",
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--appendonly", "no",
            "--save", "",
            "--dir", self._dir,
        ]  # fmt: skip

    def _wait_for_nodes(self) -> None:
        for port in self.ports:
            _retry(lambda p=port: _ping(p))

    def _wait_for_ok(self) -> None:
        def ok() -> bool:
            infos = [_cluster_info(p) for p in self._procs]
            return all("cluster_state:ok" in i for i in infos) and self._replicas_in_sync()

        _retry(ok, timeout_s=60)

    def _replicas_in_sync(self) -> bool:
        synced = sum(
            "master_link_status:up" in _redis_cli(p, "INFO", "replication") for p in self._procs
        )
        return synced >= NUM_MASTERS * self.num_replicas

    def master_of(self, key: str) -> int:
        """The port of the master that holds ``key`` now."""
        client = self.client()
        try:
            return int(client.get_node_from_key(key).port)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (it stays dead)."""
        proc = self._procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def wait_for_failover(self, dead: int, key: str, timeout_s: float = 60) -> int:
        """The port of the replica promoted in place of master ``dead`` (the one holding
        ``key`` now), once every live node says the cluster is ok again."""

        def promoted() -> bool:
            live = list(self._procs)
            if not all("cluster_state:ok" in _cluster_info(p) for p in live):
                return False
            owner = _redis_cli(live[0], "CLUSTER", "NODES")
            return f":{dead}@" not in _owner_line(owner, key)

        _retry(promoted, timeout_s)
        return self.master_of(key)

    def client(self) -> RedisCluster:
        return RedisCluster.from_url(self.node_url)

    def stop(self) -> None:
        for proc in self._procs.values():
            proc.terminate()
        for proc in self._procs.values():
            proc.wait(timeout=10)
        self._procs.clear()
        shutil.rmtree(self._dir, ignore_errors=True)


def _redis_cli(port: int, *args: str) -> str:
    out = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, timeout=5, check=False
    )
    return out.stdout.decode()


def _owner_line(nodes: str, key: str) -> str:
    """The CLUSTER NODES line of the master serving ``key``'s slot."""
    from redis.crc import key_slot

    slot = key_slot(key.encode())
    for line in nodes.splitlines():
        fields = line.split()
        if "master" not in fields[2] or "fail" in fields[2]:
            continue
        for span in fields[8:]:
            first, _, last = span.partition("-")
            if first.isdigit() and int(first) <= slot <= int(last or first):
                return line
    return ""


def _ping(port: int) -> bool:
    return _redis_cli(port, "PING").strip() == "PONG"


def _cluster_info(port: int) -> str:
    return _redis_cli(port, "CLUSTER", "INFO")


def _retry(check: object, timeout_s: float = 10) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise RuntimeError("the test Redis Cluster did not come up")
