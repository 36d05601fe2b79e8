"""Batches and usage on the dashboard: rows with progress and tenant, cancel, and each
tenant's usage in the overview; on fakeredis and a real redis-server."""

from __future__ import annotations

import time

import pytest

from producer.batch import driver, store
from producer.batch.collect import Pending
from producer.batch.context import Context
from producer.batch.models import BatchState
from producer.batch.ops import Batches
from producer.dashboard.actions import AsyncAdmin
from producer.dashboard.batches import batch_rows, usage_rows
from producer.dashboard.errors import NotFoundError
from shared.keys import BatchKeys
from shared.models import RequestState, Usage
from shared.scripts import AsyncScripts, Scripts
from shared.usage import Used, record_call
from tests.producer.batch.conftest import jsonl
from tests.producer.dashboard.conftest import MODEL, World


def _batch(world: World, num_lines: int, tenant: str) -> str:
    batches = Batches(world.client)
    batch_id = batches.submit(jsonl(num_lines).replace('"m"', f'"{MODEL}"'), tenant=tenant)
    ctx = Context(world.sync, world.settings)
    driver.fan_out(ctx, batch_id, store.meta(ctx, batch_id))  # its lines go in the queue
    return batch_id


def _admin(world: World) -> AsyncAdmin:
    return AsyncAdmin(world.aio, world.keys, world.settings, AsyncScripts(world.aio))


async def test_batches_list_with_state_progress_and_tenant(world: World) -> None:
    batch_id = _batch(world, 4, "acme")
    world.sync.hset(BatchKeys().outputs(batch_id), mapping={"line-0": "{}", "line-1": "{}"})
    (row,) = await batch_rows(world.aio, BatchKeys(), 10)
    assert (row.id, row.state, row.tenant) == (batch_id, "in_progress", "acme")
    assert (row.total, row.completed, row.done, row.progress) == (4, 2, 2, 0.5)
    assert row.in_flight == 4 and row.created_ms is not None


async def test_cancel_marks_the_batch_and_cancels_its_queued_lines(world: World) -> None:
    batch_id = _batch(world, 3, "acme")
    pending = world.sync.hvals(BatchKeys().pending(batch_id))
    ids = [i for value in pending for i in Pending.decode(value).ids]
    assert await _admin(world).cancel_batch(BatchKeys(), batch_id) == "cancelling"
    assert [world.client.handle(i).status().state for i in ids] == [RequestState.CANCELLED] * 3
    assert store.meta(Context(world.sync, world.settings), batch_id)["state"] == "cancelling"
    # A second cancel, or one of a batch that ended, changes nothing.
    assert await _admin(world).cancel_batch(BatchKeys(), batch_id) == "cancelling"
    driver.finish(Context(world.sync, world.settings), batch_id, BatchState.CANCELLED)
    assert await _admin(world).cancel_batch(BatchKeys(), batch_id) == "cancelled"


async def test_cancel_of_a_missing_batch_is_404(world: World) -> None:
    with pytest.raises(NotFoundError, match="does not exist"):
        await _admin(world).cancel_batch(BatchKeys(), "batch_" + "0" * 24)


async def test_usage_rows_are_the_last_days_per_tenant(world: World) -> None:
    used: list[Used | tuple[str, Usage]] = [
        Used("acme", Usage(prompt_tokens=3, completion_tokens=4), 40, 30),
        ("beta", Usage()),
    ]
    Scripts(world.sync).run(record_call(world.keys, world.settings, used))
    rows = await usage_rows(world.aio, world.keys, time.time())
    assert [(u.tenant, u.total_tokens, u.requests) for u in rows] == [
        ("acme", 7, 1),
        ("beta", 0, 1),
    ]
    hits = [(u.cache_hit_tokens, u.cache_queried_tokens, u.cache_hit_rate) for u in rows]
    assert hits == [(30, 40, 0.75), (0, 0, 0.0)]
