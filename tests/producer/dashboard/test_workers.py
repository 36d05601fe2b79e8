from __future__ import annotations

import time

from producer.dashboard.workers import worker_rows
from tests.producer.dashboard.conftest import World


async def _rows(world: World, window_s: float = 3600) -> list[dict[str, object]]:
    rows = await worker_rows(world.aio, world.keys, int(time.time() * 1000), window_s, 100)
    return [row.model_dump() for row in rows]


async def test_live_worker_figures(world: World) -> None:
    world.register_worker(
        "w-live",
        running=6,
        max_num_seqs=8,
        kv_cache_usage=0.5,
        prefix_cache_hit_rate=0.8,
        affinity_claims=17,
    )
    [row] = await _rows(world)
    assert row["alive"] is True
    assert row["occupancy"] == 0.75
    assert (row["model"], row["device"], row["version"]) == ("m", "cpu", "0.1.0")
    assert (row["running"], row["kv_cache_usage"], row["tokens_per_s"]) == (6, 0.5, 12.5)
    assert (row["prefix_cache_hit_rate"], row["affinity_claims"]) == (0.8, 17)
    assert float(row["heartbeat_age_s"]) < 5  # type: ignore[arg-type]


async def test_the_engines_own_figures_are_shown_when_it_reports_them(world: World) -> None:
    world.register_worker("w-vllm", waiting=3, preemptions=5, spec_acceptance_rate=0.625)
    world.register_worker("w-plain")
    plain, vllm = await _rows(world)  # by id
    assert (vllm["waiting"], vllm["preemptions"], vllm["spec_acceptance_rate"]) == (3, 5, 0.625)
    assert (plain["waiting"], plain["preemptions"], plain["spec_acceptance_rate"]) == (None,) * 3


async def test_recently_dead_worker_is_listed_after_the_live(world: World) -> None:
    world.register_worker("a-dead", alive=False)
    world.register_worker("z-live")
    rows = await _rows(world)
    assert [(r["id"], r["alive"], r["state"]) for r in rows] == [
        ("z-live", True, "serving"),
        ("a-dead", False, "dead"),
    ]


async def test_workers_dead_for_longer_than_the_window_are_left_out(world: World) -> None:
    world.sync.zadd(world.keys.workers(), {"long-gone": time.time() - 7200})
    world.register_worker("w")
    assert [r["id"] for r in await _rows(world, window_s=3600)] == ["w"]
