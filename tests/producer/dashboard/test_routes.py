"""The JSON API and the request stream, as the page reads them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI

from producer.dashboard.app import create_dashboard_app
from producer.dashboard.config import DashboardConfig
from producer.dashboard.routes import create_dashboard_router
from producer.embedded import EmbeddedRedis
from shared.keys import model_tag
from shared.models import FinishReason
from shared.settings import Settings
from tests.producer.dashboard.conftest import MODEL, TOKEN, AppFactory, World, http


def _events(body: str) -> list[tuple[str, str | None, dict[str, object]]]:
    """(event, id, data) of each SSE message."""
    out = []
    for block in filter(None, body.split("\n\n")):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((fields["event"], fields.get("id"), orjson.loads(fields["data"])))
    return out


async def test_overview_lists_queues_workers_and_requests(
    make_app: AppFactory, fake_world: World
) -> None:
    [rid] = fake_world.submit(1, "critical")
    fake_world.register_worker("w1")
    async with http(make_app()) as client:
        body = (await client.get("/admin/api/overview")).json()
    assert body["queues"][0]["priorities"][0]["name"] == "critical"
    assert [w["id"] for w in body["workers"]] == ["w1"]
    assert [r["id"] for r in body["lists"]["queued"]] == [rid]


async def test_request_stream_replays_tokens_then_the_final(
    make_app: AppFactory, fake_world: World
) -> None:
    [rid] = fake_world.submit(1)
    [claimed] = fake_world.claim("w1", rid)
    fake_world.publish(claimed, "Hello", 0)
    fake_world.publish(claimed, " world", 1)
    fake_world.finish(claimed, FinishReason.CANCELLED, state="cancelled")
    async with http(make_app()) as client:
        events = _events((await client.get(f"/admin/api/requests/{rid}/stream")).text)
        first_id = events[1][1]
        resumed = _events(
            (await client.get(f"/admin/api/requests/{rid}/stream?after={first_id}")).text
        )
    kinds = [e[0] for e in events]
    assert kinds == ["status", "token", "token", "final", "status"]
    assert "".join(str(e[2]["text"]) for e in events if e[0] == "token") == "Hello world"
    assert events[3][2]["finish_reason"] == "cancelled"
    assert events[-1][2]["state"] == "cancelled"
    assert [e[2].get("text") for e in resumed if e[0] == "token"] == [" world"]


async def test_stream_refuses_bad_cursors_and_unknown_ids(make_app: AppFactory) -> None:
    unknown = f"{model_tag(MODEL)}-{'0' * 24}"
    async with http(make_app()) as client:
        bad = await client.get(f"/admin/api/requests/{unknown}/stream?after=zz")
        missing = await client.get(f"/admin/api/requests/{unknown}/stream")
        malformed = await client.get("/admin/api/requests/not-an-id")
    assert bad.status_code == 400 and "bad stream cursor" in bad.json()["error"]["message"]
    assert missing.status_code == 404 and "does not exist" in missing.json()["error"]["message"]
    assert malformed.status_code == 400 and "malformed request id" in malformed.text


async def test_actions_answer_what_happened(make_app: AppFactory, fake_world: World) -> None:
    [queued] = fake_world.submit(1)
    tag = model_tag(MODEL)
    fake_world.register_worker("w1")
    async with http(make_app()) as client:
        retry = await client.post(f"/admin/api/requests/{queued}/retry")
        pause = await client.post(f"/admin/api/queues/{tag}/pause")
        drain = await client.post("/admin/api/workers/w1/drain")
        purge = await client.post("/admin/api/dead/purge")
        listed = await client.get("/admin/api/requests", params={"kind": "queued"})
    assert retry.status_code == 409
    assert "only dead requests can be retried" in retry.json()["error"]["message"]
    assert pause.json() == {"tag": tag, "paused": True}
    assert drain.json() == {"worker": "w1", "draining": True}
    assert purge.json() == {"purged": 0}
    assert [r["id"] for r in listed.json()] == [queued]


async def test_standalone_app_serves_and_samples_history(redis_server: EmbeddedRedis) -> None:
    settings = Settings(redis_url=redis_server.url)
    app = create_dashboard_app(settings, DashboardConfig(sample_interval_s=0.2).with_token(TOKEN))
    async with app.router.lifespan_context(app), http(app) as client:
        root = await client.get("/")
        for _ in range(50):
            samples = (await client.get("/admin/api/history", params={"window_s": 60})).json()
            if samples:
                break
            await asyncio.sleep(0.1)
    assert root.headers["location"] == "/admin/"
    assert samples and {"t", "queues", "workers", "ttft"} <= set(samples[0])


async def test_mounts_in_a_host_app_that_opens_redis_in_its_lifespan(fake_world: World) -> None:
    """As the gateway mounts it: the connection comes from the host's own startup."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.redis = fake_world.aio
        yield

    host = FastAPI(lifespan=lifespan)
    config = DashboardConfig(sample_interval_s=60).with_token(TOKEN)
    router = create_dashboard_router(fake_world.settings, lambda: host.state.redis, config)
    host.include_router(router, prefix="/admin")
    async with host.router.lifespan_context(host), http(host) as client:
        reply = await client.get("/admin/api/overview")
    assert reply.status_code == 200
    assert reply.json()["queues"][0]["model"] == MODEL
