"""The live overview stream: one overview per push interval, and each new sample."""

from __future__ import annotations

import orjson

from producer.dashboard.config import DashboardConfig
from producer.dashboard.history import Sampler
from producer.dashboard.live import overview_events
from producer.dashboard.service import Dashboard
from tests.producer.dashboard.conftest import AppFactory, World, http


async def test_overview_then_the_latest_sample(fake_world: World) -> None:
    config = DashboardConfig(push_interval_s=0.05)
    dash = Dashboard(fake_world.settings, config, fake_world.aio)
    fake_world.submit(2)
    await Sampler(fake_world.aio, fake_world.keys, config).sample_if_due()
    events = aiter(overview_events(dash))
    frames = [await anext(events) for _ in range(3)]
    await events.aclose()  # type: ignore[attr-defined]
    kinds = [f.split(b"\n", 1)[0] for f in frames]
    assert kinds == [b"event: overview", b"event: sample", b"event: overview"]
    overview = orjson.loads(frames[0].split(b"data: ", 1)[1])
    assert overview["queues"][0]["depth"] == 2


async def test_viewers_share_one_overview_per_interval(fake_world: World) -> None:
    dash = Dashboard(fake_world.settings, DashboardConfig(push_interval_s=60), fake_world.aio)
    first = await dash.overview()
    fake_world.submit(1)
    assert await dash.overview() is first


async def test_rates_come_from_the_last_minute_of_history(fake_world: World) -> None:
    dash = Dashboard(fake_world.settings, DashboardConfig(push_interval_s=0), fake_world.aio)
    sampler = Sampler(fake_world.aio, fake_world.keys, DashboardConfig())
    now_ms = await dash.now_ms()
    queues = {"m": {"depth": 0, "enqueued": 0, "running": 0, "p": {}}}
    await sampler.append({"t": now_ms - 20_000, "queues": {}})  # before the model existed
    await sampler.append({"t": now_ms - 10_000, "queues": queues})
    await sampler.append(
        {"t": now_ms, "queues": {"m": {**queues["m"], "depth": 5, "enqueued": 20}}}
    )
    [queue] = (await dash.overview()).queues
    assert (queue.rate_in_per_s, queue.rate_out_per_s) == (2.0, 1.5)


async def test_an_action_refreshes_the_shared_overview(
    make_app: AppFactory, fake_world: World
) -> None:
    [rid] = fake_world.submit(1)
    async with http(make_app(push_interval_s=60)) as client:
        before = (await client.get("/admin/api/overview")).json()
        await client.post(f"/admin/api/requests/{rid}/cancel")
        after = (await client.get("/admin/api/overview")).json()
    assert [r["id"] for r in before["lists"]["queued"]] == [rid]
    assert after["lists"]["queued"] == []
    assert [r["state"] for r in after["lists"]["recent"]] == ["cancelled"]
