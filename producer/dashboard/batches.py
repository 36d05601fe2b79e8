"""Batches and usage for the dashboard: the newest batches with their progress, and
each tenant's usage over the last day, read over the dashboard's asyncio connection."""

from __future__ import annotations

from typing import Any

import redis.asyncio
from pydantic import BaseModel

from producer.dashboard.values import int_or_none
from shared.keys import BatchKeys, Keys
from shared.replies import text
from shared.usage import last_hours, read_usage_async, totals

USAGE_HOURS = 24


class BatchRow(BaseModel):
    id: str
    state: str
    tenant: str | None = None
    priority: int = 0
    total: int = 0
    completed: int = 0
    failed: int = 0
    in_flight: int = 0
    done: int = 0
    progress: float = 0.0  # done / total
    created_ms: int | None = None
    finished_ms: int | None = None


class UsageRow(BaseModel):
    tenant: str
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    requests: int
    # Its prompt tokens looked up in the prefix cache (its own, unless shared), and found.
    cache_queried_tokens: int = 0
    cache_hit_tokens: int = 0
    cache_hit_rate: float = 0.0


async def batch_rows(r: redis.asyncio.Redis, bkeys: BatchKeys, limit: int) -> list[BatchRow]:
    """The newest ``limit`` batches (ones that expired are left out)."""
    ids = [text(m) for m in await r.zrevrange(bkeys.batches(), 0, limit - 1)]
    pipe = r.pipeline(transaction=False)
    for batch_id in ids:
        pipe.hgetall(bkeys.meta(batch_id))
        for key in (bkeys.outputs(batch_id), bkeys.errors(batch_id), bkeys.pending(batch_id)):
            pipe.hlen(key)
    replies = await pipe.execute()
    rows = [_batch(ids[n], *replies[n * 4 : n * 4 + 4]) for n in range(len(ids))]
    return [row for row in rows if row is not None]


def _batch(
    batch_id: str, raw: dict[Any, Any], completed: int, failed: int, in_flight: int
) -> BatchRow | None:
    meta = {text(k): text(v) for k, v in raw.items()}
    if not meta:
        return None
    total = int_or_none(meta.get("total")) or 0
    done = completed + failed
    return BatchRow(
        id=batch_id,
        state=meta.get("state", "?"),
        tenant=meta.get("tenant") or None,
        priority=int_or_none(meta.get("priority")) or 0,
        total=total,
        completed=completed,
        failed=failed,
        in_flight=in_flight,
        done=done,
        progress=round(done / total, 4) if total else 0.0,
        created_ms=int_or_none(meta.get("created_ms")),
        finished_ms=int_or_none(meta.get("finished_ms")),
    )


async def usage_rows(r: redis.asyncio.Redis, keys: Keys, now_s: float) -> list[UsageRow]:
    """Each tenant's usage over the last ``USAGE_HOURS`` hours, the heaviest first."""
    rows = totals(await read_usage_async(r, keys, last_hours(USAGE_HOURS, now_s)))
    return [
        UsageRow(
            tenant=u.tenant,
            prompt_tokens=u.prompt_tokens,
            completion_tokens=u.completion_tokens,
            total_tokens=u.total_tokens,
            requests=u.requests,
            cache_queried_tokens=u.cache_queried_tokens,
            cache_hit_tokens=u.cache_hit_tokens,
            cache_hit_rate=round(u.cache_hit_rate, 4),
        )
        for u in rows
    ]
