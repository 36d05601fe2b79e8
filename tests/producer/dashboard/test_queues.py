from __future__ import annotations

import time

from producer.dashboard.queues import known_models, queue_stats
from shared.flows import drive, fence_flow
from shared.keys import model_tag
from shared.ops.moves import FenceMode
from tests.producer.dashboard.conftest import MODEL, World


async def _stats(world: World) -> dict[str, object]:
    models = await known_models(world.aio, world.keys, 10)
    [stats] = await queue_stats(world.aio, world.keys, models, int(time.time() * 1000))
    return stats.model_dump()


async def test_depth_per_priority_highest_first(world: World) -> None:
    world.submit(2, "low")
    world.submit(3, "critical")
    world.submit(1, 60)
    stats = await _stats(world)
    depths = [(p["name"], p["depth"]) for p in stats["priorities"]]  # type: ignore[attr-defined]
    assert depths == [("critical", 3), ("60", 1), ("low", 2)]
    assert stats["depth"] == 6
    assert stats["enqueued"] == 6


async def test_oldest_age_is_the_longest_waiting_request(world: World) -> None:
    world.submit(1, "high")
    time.sleep(0.3)
    world.submit(1, "high")
    stats = await _stats(world)
    [high] = stats["priorities"]  # type: ignore[misc]
    assert 0.25 < high["oldest_age_s"] < 5  # type: ignore[has-type]


async def test_running_dead_and_paused(world: World) -> None:
    first, _ = world.submit(2)
    world.claim("w1", first)
    world.sync.set(world.keys.paused(model_tag(MODEL)), 1)
    stats = await _stats(world)
    assert (stats["depth"], stats["running"], stats["dead"], stats["paused"]) == (1, 1, 0, True)


async def test_an_empty_queue_has_no_priorities(world: World) -> None:
    stats = await _stats(world)
    assert stats["depth"] == 0
    assert stats["priorities"] == []


async def test_a_requeued_request_counts_as_the_oldest(world: World) -> None:
    [first] = world.submit(1)
    time.sleep(0.3)
    world.submit(1)
    [claimed] = world.claim("w1", first)
    held = {first: claimed.lease_token}
    flow = fence_flow(world.keys, world.settings, model_tag(MODEL), held, FenceMode.RELEASE)
    drive(world.scripts, flow)
    stats = await _stats(world)
    [normal] = stats["priorities"]  # type: ignore[misc]
    assert normal["depth"] == 2  # type: ignore[has-type]
    assert normal["oldest_age_s"] >= 0.3  # type: ignore[has-type]
