"""`tokenq up` owns its children: SIGTERM or SIGINT to its process alone (what systemd,
supervisord or `kill` send) stops the worker, the gateway and the embedded redis-server,
and `tokenq up` exits; no process it started is left (checked by process id)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen

import pytest

from producer.embedded import free_port
from shared.settings import DEFAULT_MODEL
from tests.integration.test_cli import Output

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SERVE_TIMEOUT_S = 240.0
GONE_TIMEOUT_S = 90.0  # the worker's drain (30 s at most) and the rest


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # it ended meanwhile
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until_served(url: str, up: subprocess.Popen[str], output: Output) -> None:
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    while time.monotonic() < deadline:
        if up.poll() is not None:
            pytest.fail("tokenq up exited:\n" + "".join(output.lines))
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as reply:
                if DEFAULT_MODEL in reply.read().decode():
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    pytest.fail("the worker did not serve in time:\n" + "".join(output.lines))


@contextmanager
def up_serving(tmp_path: Path, default_model_dir: Path) -> Iterator[tuple[Popen[str], Output]]:
    """`tokenq up` in its own session (a signal reaches it only by its pid, never by a
    process group), serving the default model; whatever is left of it is killed at the
    end."""
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "TOKENQ_MODEL_CACHE_DIR": str(default_model_dir.parent),
    }
    env.pop("TOKENQ_REDIS_URL", None)
    port = free_port()
    command = [sys.executable, "-m", "producer.cli", "up", "--port", str(port)]
    with subprocess.Popen(
        command, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as up:
        output = Output(up)
        children: set[int] = set()
        try:
            output.wait_until_up()
            wait_until_served(f"http://127.0.0.1:{port}", up, output)
            children = descendants(up.pid)
            assert len(children) >= 3, children  # redis-server, the worker, the gateway
            yield up, output
        finally:
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait(timeout=30)
            for pid in children:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            output.join(timeout=10)


def gone_within(children: set[int], timeout_s: float) -> set[int]:
    """Which of ``children`` are still alive after waiting up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while {p for p in children if alive(p)} and time.monotonic() < deadline:
        time.sleep(0.1)
    return {p for p in children if alive(p)}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_up_alone_stops_every_child(
    tmp_path: Path, default_model_dir: Path, signum: signal.Signals
) -> None:
    with up_serving(tmp_path, default_model_dir) as (up, output):
        children = descendants(up.pid)
        os.kill(up.pid, signum)
        assert up.wait(timeout=GONE_TIMEOUT_S) == 0
        assert gone_within(children, 10) == set(), "".join(output.lines)
        assert not (tmp_path / ".cache" / "tokenq" / "up.url").exists()


def test_up_killed_outright_takes_its_children_with_it(
    tmp_path: Path, default_model_dir: Path
) -> None:
    """SIGKILL gives `tokenq up` no chance to stop anything: each child is sent a
    SIGTERM by the kernel as its parent dies, and stops by itself."""
    with up_serving(tmp_path, default_model_dir) as (up, _):
        children = descendants(up.pid)
        os.kill(up.pid, signal.SIGKILL)
        assert up.wait(timeout=10) == -signal.SIGKILL
        assert gone_within(children, GONE_TIMEOUT_S) == set()
