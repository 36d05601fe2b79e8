"""A Redis for ``tokenq up``: a real ``redis-server`` when one is installed, else
fakeredis's in-process TCP server (with Lua), so a fresh machine needs nothing."""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# prctl(PR_SET_PDEATHSIG, ...): looked up here, so that the child only calls it
# between fork and exec.
_PR_SET_PDEATHSIG = 1
_prctl: Any
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: children outlive a killed parent there
    _prctl = None


def die_with_parent() -> None:
    """For ``preexec_fn``: the child gets SIGTERM when the thread that started it ends,
    its process killed by SIGKILL included (Linux). So a `tokenq up` killed outright
    leaves no Redis, worker or gateway behind; start such children from the main
    thread."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class EmbeddedRedis:
    """A Redis on a free loopback port; ``kind`` says which one."""

    port: int = field(default_factory=free_port)
    kind: str = ""
    _process: subprocess.Popen[bytes] | None = None
    _fake: object | None = None
    _dir: str | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> EmbeddedRedis:
        if shutil.which("redis-server"):
            self._start_server()
        else:
            self._start_fake()
        wait_for_redis(self.url)
        return self

    def _start_server(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="tokenq-redis-")
        args = ["redis-server", *shipped_config_args(), "--port", str(self.port)]
        args += ["--bind", "127.0.0.1", "--dir", self._dir]
        self._process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent
        )
        self.kind = "redis-server"

    def _start_fake(self) -> None:
        from fakeredis import TcpFakeServer

        server = TcpFakeServer(("127.0.0.1", self.port), server_type="redis")
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._fake = server
        self.kind = "fakeredis (in-process; install redis-server for a real one)"

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
        if self._fake is not None:
            self._fake.shutdown()  # type: ignore[attr-defined]
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


def shipped_config_args() -> list[str]:
    """deploy/redis.conf as redis-server arguments (when running from a checkout),
    else the same settings spelled out."""
    conf = Path(__file__).parents[1] / "deploy" / "redis.conf"
    if conf.exists():
        return [str(conf)]
    return [
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--maxmemory-policy",
        "noeviction",
        "--save",
        "",
    ]


def wait_for_redis(url: str, timeout_s: float = 10.0) -> None:
    give_up = time.monotonic() + timeout_s
    client = redis.Redis.from_url(url)
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.05)
        finally:
            client.close()
