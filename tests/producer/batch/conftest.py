"""Factories for batch tests: batches on fakeredis and a scripted tokenq worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fakeredis
import orjson
import pytest

from producer.batch.ops import Batches
from producer.client import Client
from shared.settings import Settings
from tests.conftest import serve
from tests.worker.fakes import ScriptedEngine
from worker.service import WorkerService

MODEL = "m"
SECRET = "test-secret"


def batch_settings(base: Settings | None = None, **overrides: Any) -> Settings:
    """Fast batch ticks on top of ``base`` (default settings), with ``overrides``."""
    values: dict[str, Any] = {
        "batch_tick_s": 0.05,
        "batch_poll_s": 0.01,
        "batch_max_in_flight": 4,
        "webhook_secret": SECRET,
    }
    fields = {**(base or Settings()).model_dump(), **values, **overrides}
    return Settings(**fields)


def jsonl(num_lines: int, *, max_tokens: int = 3, url: str = "/v1/chat/completions") -> str:
    """``num_lines`` lines in OpenAI's batch format, custom_ids ``line-<i>``."""
    lines = []
    for i in range(num_lines):
        if url == "/v1/completions":
            body: dict[str, Any] = {"model": MODEL, "prompt": f"p {i}", "max_tokens": max_tokens}
        else:
            messages = [{"role": "user", "content": f"hello {i}"}]
            body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens}
        line = {"custom_id": f"line-{i}", "method": "POST", "url": url, "body": body}
        lines.append(orjson.dumps(line).decode())
    return "\n".join(lines) + "\n"


@pytest.fixture
def make_batches(fake_redis: fakeredis.FakeRedis) -> Callable[..., Batches]:
    def make(settings: Settings | None = None, **overrides: Any) -> Batches:
        serve(fake_redis, MODEL)
        merged = batch_settings(settings, **overrides)
        return Batches(Client(connection=fake_redis, settings=merged))

    return make


@pytest.fixture
def tokenq_worker(fake_redis: fakeredis.FakeRedis) -> Callable[..., WorkerService]:
    def make(settings: Settings | None = None) -> WorkerService:
        engine = ScriptedEngine()
        return WorkerService(engine, fake_redis, settings or Settings(), MODEL, "w1")

    return make
