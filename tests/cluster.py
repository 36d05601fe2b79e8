"""A real Redis Cluster of three masters on free loopback ports, for tests."""

from __future__ import annotations

import random
import shutil
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
    ports: list[int] = field(default_factory=lambda: free_cluster_ports(NUM_MASTERS))
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _dir: str = ""

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` URL of one node (any node finds the rest)."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    @property
    def node_url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}"

    def start(self) -> LocalCluster:
        self._dir = tempfile.mkdtemp(prefix="tokenq-cluster-")
        for port in self.ports:
            self._procs.append(subprocess.Popen(self._node_args(port), stdout=subprocess.DEVNULL))
        self._wait_for_nodes()
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        create = ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "0"]
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
            "--cluster-node-timeout", "5000",
            "--appendonly", "no",
            "--save", "",
            "--dir", self._dir,
        ]  # fmt: skip

    def _wait_for_nodes(self) -> None:
        for port in self.ports:
            _retry(lambda p=port: _ping(p))

    def _wait_for_ok(self) -> None:
        def ok() -> bool:
            infos = [_cluster_info(p) for p in self.ports]
            return all("cluster_state:ok" in i for i in infos)

        _retry(ok, timeout_s=30)

    def client(self) -> RedisCluster:
        return RedisCluster.from_url(self.node_url)

    def stop(self) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.wait(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)


def _redis_cli(port: int, *args: str) -> str:
    out = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, timeout=5, check=False
    )
    return out.stdout.decode()


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
