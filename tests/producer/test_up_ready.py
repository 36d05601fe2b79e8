"""`tokenq up`'s readiness wait: a worker still loading is not up, one that registered
``serving`` is; a child that exits ends the wait; the keys line follows the settings."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from producer.embedded import EmbeddedRedis
from producer.up_ready import Gateway, api_keys_line, curl_command, wait_until_serving
from shared.keys import Keys
from shared.registry import register_worker
from shared.settings import Settings

MODEL = "some-model"


def _register(url: str, state: str) -> None:
    connection = redis.Redis.from_url(url)
    pipe = connection.pipeline(transaction=False)
    register_worker(pipe, Keys(), Settings(redis_url=url), "w1", {"model": MODEL, "state": state})
    pipe.execute()
    connection.close()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A child process that stays up (as a worker and a gateway do)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_loading_worker_is_not_up_until_it_registers_serving(
    redis_server: EmbeddedRedis, real_redis: redis.Redis, sleeper: subprocess.Popen[bytes]
) -> None:
    _register(redis_server.url, "loading")
    serving_at: list[float] = []

    def serve_later() -> None:
        time.sleep(1.0)
        serving_at.append(time.monotonic())
        _register(redis_server.url, "serving")

    threading.Thread(target=serve_later, daemon=True).start()
    assert wait_until_serving(redis_server.url, MODEL, [sleeper], None)
    assert serving_at, "up before the worker registered serving"


def test_a_child_that_exits_ends_the_wait(
    redis_server: EmbeddedRedis, real_redis: redis.Redis
) -> None:
    _register(redis_server.url, "loading")
    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    gone.wait()
    assert not wait_until_serving(redis_server.url, MODEL, [gone], None)


def test_the_keys_line_says_whether_the_gateway_wants_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = Gateway(8000, "token")
    monkeypatch.delenv("TOKENQ_API_KEYS", raising=False)
    assert api_keys_line().startswith("off")
    assert "Authorization" not in curl_command(gateway, MODEL)
    monkeypatch.setenv("TOKENQ_API_KEYS", "sk-a=acme:high")
    assert api_keys_line().startswith("on")
    assert "Authorization: Bearer <key>" in curl_command(gateway, MODEL)
