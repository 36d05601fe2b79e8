"""A gateway under real uvicorn (in a thread) over the session's redis-server, with a
scripted worker serving ``MODEL``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import redis
import uvicorn

from producer.api_keys import parse_api_keys
from producer.embedded import EmbeddedRedis, free_port
from producer.gateway.app import create_app
from producer.gateway.config import GatewayConfig
from shared.settings import Settings
from tests.producer.gateway.scripted import ScriptedWorker

START_TIMEOUT_S = 10.0


@dataclass
class RunningGateway:
    url: str
    worker: ScriptedWorker
    redis: redis.Redis
    settings: Settings

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10, **kwargs)  # type: ignore[arg-type]


class ThreadedServer:
    """uvicorn serving ``app`` on a free loopback port in a daemon thread."""

    def __init__(self, app: object) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")  # type: ignore[arg-type]
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            raise RuntimeError("gateway did not start")
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=START_TIMEOUT_S)


def serve(
    redis_server: EmbeddedRedis, api_keys: str = "", **settings: object
) -> Iterator[RunningGateway]:
    connection = redis.Redis.from_url(redis_server.url)
    connection.flushall()
    s = Settings(redis_url=redis_server.url, **settings)  # type: ignore[arg-type]
    worker = ScriptedWorker(redis_server.url, s).start()
    config = GatewayConfig(api_keys=parse_api_keys(api_keys), idle_check_s=0.5)
    try:
        with ThreadedServer(create_app(s, config)) as url:
            yield RunningGateway(url, worker, connection, s)
    finally:
        worker.stop()
        connection.close()


@pytest.fixture
def gateway(redis_server: EmbeddedRedis) -> Iterator[RunningGateway]:
    yield from serve(redis_server, max_queued=20)


@pytest.fixture
def keyed_gateway(redis_server: EmbeddedRedis) -> Iterator[RunningGateway]:
    yield from serve(redis_server, "sk-ops=ops:critical,sk-web=web:normal")
