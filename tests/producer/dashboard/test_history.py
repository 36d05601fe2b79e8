from __future__ import annotations

import time

import pytest

from producer.dashboard.config import DashboardConfig
from producer.dashboard.history import Sampler, history, percentiles
from shared.keys import Keys
from shared.models import FinishReason
from tests.producer.dashboard.conftest import MODEL, World


def _sampler(world: World, **config: float) -> Sampler:
    return Sampler(world.aio, world.keys, DashboardConfig(**config))  # type: ignore[arg-type]


async def _history(world: World) -> list[dict[str, object]]:
    dkeys = Keys(world.keys.namespace)
    return await history(world.aio, dkeys, 3600, int(time.time() * 1000) + 1000, 10_000)


async def test_snapshot_has_depth_per_priority_and_worker_rates(world: World) -> None:
    world.submit(2, "high")
    world.submit(1, "low")
    world.register_worker("w1", tokens_per_s=42.0)
    assert await _sampler(world).sample_if_due()
    [sample] = await _history(world)
    assert sample["queues"] == {
        MODEL: {"depth": 3, "enqueued": 3, "running": 0, "p": {"75": 2, "25": 1}}
    }
    assert sample["workers"]["w1"]["tps"] == 42.0  # type: ignore[index]


async def test_one_sampler_per_interval_across_processes(world: World) -> None:
    first, second = _sampler(world, sample_interval_s=30), _sampler(world, sample_interval_s=30)
    assert await first.sample_if_due()
    assert not await second.sample_if_due()
    assert not await first.sample_if_due()
    assert len(await _history(world)) == 1


async def test_history_is_capped(world: World) -> None:
    sampler = _sampler(world, sample_interval_s=60, history_s=60)
    for _ in range(sampler.config.history_len + 150):
        await sampler.append({"t": 1, "queues": {}, "workers": {}, "ttft": {}})
    length = await world.aio.xlen(Keys().dashboard_history())
    assert length <= sampler.config.history_len + 100  # MAXLEN ~ trims by whole nodes


async def test_ttft_percentiles_of_requests_ended_since_the_last_sample(world: World) -> None:
    sampler = _sampler(world)
    await sampler.append({"t": int(time.time() * 1000) - 1000})
    ids = world.submit(3)
    for claimed in world.claim("w1", *ids):
        world.publish(claimed, "x")
        world.finish(claimed, FinishReason.STOP)
    snapshot = await sampler.snapshot()
    assert snapshot["ttft"][MODEL]["n"] == 3


@pytest.mark.parametrize(
    ("values", "expected"),
    [([1.0], (1.0, 1.0, 1.0)), ([float(i) for i in range(1, 11)], (5.0, 9.0, 10.0))],
)
def test_percentiles_nearest_rank(values: list[float], expected: tuple[float, ...]) -> None:
    p = percentiles(values)
    assert (p["p50"], p["p90"], p["p99"]) == expected
