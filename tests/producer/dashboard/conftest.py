"""A queue world for dashboard tests: a sync connection to set things up as clients and
workers do (through the real scripts), and the asyncio connection the dashboard reads,
both on fakeredis or on a real redis-server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import httpx
import pytest
import redis
import redis.asyncio
from fastapi import FastAPI

from producer.client import Client
from producer.dashboard.config import DashboardConfig
from producer.dashboard.routes import create_dashboard_router
from shared.flows import claim_flow, drive, finish_flow
from shared.keys import Keys, model_tag
from shared.models import FinalEvent, FinishReason, TokenEvent, dumps
from shared.ops.claim import Claim, Claimed
from shared.ops.moves import Fate
from shared.ops.publish import Finish, Publish, TokenPublish
from shared.scripts import Scripts
from shared.settings import Settings
from tests.conftest import serve

MODEL = "m"
TOKEN = "s3cret-admin-token"


@dataclass
class World:
    """Requests and workers made the way producers and workers make them."""

    sync: redis.Redis
    aio: redis.asyncio.Redis
    settings: Settings = field(default_factory=Settings)

    def __post_init__(self) -> None:
        self.keys = Keys(self.settings.namespace)
        self.client = Client(connection=self.sync, settings=self.settings)
        self.scripts = Scripts(self.sync)
        serve(self.sync, MODEL)

    def submit(self, n: int = 1, priority: str | int = "normal", **kwargs: Any) -> list[str]:
        handles = [
            self.client.submit("hello there", model=MODEL, priority=priority, **kwargs)
            for _ in range(n)
        ]
        return [h.id for h in handles]

    def claim(self, worker_id: str, *ids: str) -> list[Claimed]:
        """Claim the queue's heads, which must be ``ids`` (in any order)."""
        n = len(ids)
        claim = Claim(model_tag(MODEL), worker_id, self.settings.lease_ms, n, n)
        claimed = drive(self.scripts, claim_flow(self.keys, self.settings, claim, cluster=True))
        assert sorted(c.request_id for c in claimed) == sorted(ids), "not the queue's heads"
        return claimed

    def publish(self, claimed: Claimed, text: str, index: int = 0) -> None:
        event = TokenEvent(index=index, token_ids=(index + 1,), text=text)
        publish = TokenPublish(claimed.request_id, claimed.lease_token, dumps(event), index, 1)
        (call,) = Publish([publish]).calls(self.keys, self.settings.result_ttl_s, cluster=True)
        self.scripts.run(call)

    def finish(self, claimed: Claimed, reason: FinishReason, state: str = "finished") -> None:
        final = FinalEvent(finish_reason=reason, error="boom" if state != "finished" else None)
        output = b'{"text": "", "token_ids": []}'
        finish = Finish(claimed.request_id, claimed.lease_token, final, output, Fate(state))
        drive(self.scripts, finish_flow(self.keys, self.settings, finish))

    def register_worker(self, worker_id: str, alive: bool = True, **fields: Any) -> None:
        info = {
            "model": MODEL,
            "version": "0.1.0",
            "pid": 1,
            "device": "cpu",
            "max_num_seqs": 8,
            "kv_cache_mib": 64,
            "running": 2,
            "tokens_per_s": 12.5,
            "kv_cache_usage": 0.25,
            "state": "serving",
            "heartbeat_ms": int(time.time() * 1000),
            **fields,
        }
        if alive:
            self.sync.hset(
                self.keys.worker(worker_id), mapping={k: str(v) for k, v in info.items()}
            )
        self.sync.zadd(self.keys.workers(), {worker_id: time.time()})


@pytest.fixture(params=["fakeredis", "redis-server"])
async def world(request: pytest.FixtureRequest) -> AsyncIterator[World]:
    if request.param == "fakeredis":
        server = fakeredis.FakeServer()
        sync: redis.Redis = fakeredis.FakeRedis(server=server)
        aio: redis.asyncio.Redis = fakeredis.FakeAsyncRedis(server=server)
    else:
        url = request.getfixturevalue("redis_server").url
        sync, aio = redis.Redis.from_url(url), redis.asyncio.Redis.from_url(url)
        sync.flushall()
    yield World(sync, aio)
    await aio.aclose()
    sync.close()


@pytest.fixture
def fake_world() -> World:
    """fakeredis only, for tests about the HTTP surface rather than Redis."""
    server = fakeredis.FakeServer()
    return World(fakeredis.FakeRedis(server=server), fakeredis.FakeAsyncRedis(server=server))


AppFactory = Callable[..., FastAPI]


@pytest.fixture
def make_app(fake_world: World) -> AppFactory:
    """An app with the dashboard under /admin; the admin token is TOKEN unless given."""

    def make(world: World | None = None, token: str | None = TOKEN, **config: Any) -> FastAPI:
        w = world or fake_world
        app = FastAPI()
        router = create_dashboard_router(
            w.settings, w.aio, DashboardConfig(**config).with_token(token)
        )
        app.include_router(router, prefix="/admin")
        return app

    return make


def http(app: FastAPI, token: str | None = TOKEN) -> httpx.AsyncClient:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers)
