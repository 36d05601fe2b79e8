"""The README's main job: `tokenq up` in one shell, `tokenq submit --stream` in another."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from shared.settings import DEFAULT_MODEL

pytestmark = [pytest.mark.integration, pytest.mark.slow]
# `tokenq up` says it is up once its worker serves: the model loaded and self-checked.
UP_TIMEOUT_S = 300


def _tokenq(*args: str) -> list[str]:
    return [sys.executable, "-m", "producer.cli", *args]


class Output(threading.Thread):
    """Drains a process's stderr (so it never blocks on a full pipe) and keeps it."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.proc, self.lines, self.up = proc, list[str](), threading.Event()
        self.start()

    def run(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if "tokenq is up" in line:
                self.up.set()

    def gateway_url(self) -> str:
        line = next(line for line in self.lines if "HTTP (OpenAI-compatible):" in line)
        return line.split(": ", 1)[1].strip().removesuffix("/v1")

    def wait_until_up(self) -> str:
        if not self.up.wait(timeout=UP_TIMEOUT_S):
            pytest.fail("tokenq up did not come up:\n" + "".join(self.lines))
        return next(line for line in self.lines if "tokenq is up" in line)


@pytest.mark.parametrize("redis_kind", ["redis-server", "fakeredis"])
def test_up_then_submit_streams_an_answer(
    tmp_path: Path, default_model_dir: Path, redis_kind: str
) -> None:
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "TOKENQ_MODEL_CACHE_DIR": str(default_model_dir.parent),
    }
    env.pop("TOKENQ_REDIS_URL", None)
    if redis_kind == "fakeredis":  # a machine without redis-server
        env["PATH"] = str(Path(sys.executable).parent)
    with subprocess.Popen(_tokenq("up"), env=env, stderr=subprocess.PIPE, text=True) as up:
        _run_against_up(up, env, redis_kind)
    assert up.returncode == 0
    assert not (tmp_path / ".cache" / "tokenq" / "up.url").exists()


def _run_against_up(up: subprocess.Popen[str], env: dict[str, str], redis_kind: str) -> None:
    output = Output(up)
    try:
        assert redis_kind in output.wait_until_up()
        submit = subprocess.run(
            _tokenq(
                "submit",
                "What is the capital of France?",
                "--priority",
                "high",
                "--stream",
                "--max-tokens",
                "16",
            ),
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert submit.returncode == 0, submit.stderr
        assert "Paris" in submit.stdout
        with urllib.request.urlopen(f"{output.gateway_url()}/v1/models", timeout=10) as reply:
            assert DEFAULT_MODEL in reply.read().decode()
        assert "finish: stop" in submit.stderr or "finish: length" in submit.stderr
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=120)
        output.join(timeout=10)


def test_submit_without_a_redis_says_what_to_do(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "TOKENQ_REDIS_URL": "redis://127.0.0.1:1/0"}
    submit = subprocess.run(
        _tokenq("submit", "hi"), env=env, capture_output=True, text=True, timeout=60
    )
    assert submit.returncode == 1
    assert "error:" in submit.stderr and "127.0.0.1:1" in submit.stderr
