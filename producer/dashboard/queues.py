"""Queue figures per model and priority, read in a few pipelined round trips.

A queue's score is ``shared.priority.queue_score``: requeued work, then new work, each
in one band per priority, in claim order (fair between tenants, arrival order within
one). So a priority's depth is the ZCOUNT of its two bands, and the first member of
each band is next to run (usually, not always, the longest waiting).
"""

from __future__ import annotations

from typing import Any

import redis.asyncio
from pydantic import BaseModel

from producer.dashboard.values import int_or_none
from shared.keys import Keys
from shared.priority import FRESH_OFFSET, MAX_PRIORITY, MIN_PRIORITY, SCORE_BAND, priority_name
from shared.replies import text

PRIORITIES = range(MAX_PRIORITY, MIN_PRIORITY - 1, -1)


class PriorityDepth(BaseModel):
    priority: int
    name: str
    depth: int
    oldest_age_s: float | None = None


class QueueStats(BaseModel):
    model: str
    tag: str
    paused: bool
    depth: int
    running: int
    dead: int
    enqueued: int
    priorities: list[PriorityDepth]
    rate_in_per_s: float | None = None
    rate_out_per_s: float | None = None


async def known_models(r: redis.asyncio.Redis, keys: Keys, limit: int) -> dict[str, str]:
    """Tag -> model for the first ``limit`` models by name."""
    raw: dict[Any, Any] = await r.hgetall(keys.models())
    pairs = sorted(((text(t), text(m)) for t, m in raw.items()), key=lambda p: p[1])
    return dict(pairs[:limit])


def band_range(priority: int, fresh: int) -> tuple[int, str]:
    """ZCOUNT/ZRANGE bounds of a priority's band of requeued (0) or new (1) work."""
    low = fresh * FRESH_OFFSET + (MAX_PRIORITY - priority) * SCORE_BAND
    return low, f"({low + SCORE_BAND}"


async def queue_stats(
    r: redis.asyncio.Redis, keys: Keys, models: dict[str, str], now_ms: int
) -> list[QueueStats]:
    totals = await _totals(r, keys, list(models))
    busy = [tag for tag, row in totals.items() if row[0] > 0]
    depths = await _band_depths(r, keys, busy)
    ages = await _oldest_ages(r, keys, depths, now_ms)
    return [_stats(tag, models[tag], totals[tag], depths.get(tag, {}), ages) for tag in models]


async def _totals(r: redis.asyncio.Redis, keys: Keys, tags: list[str]) -> dict[str, list[Any]]:
    pipe = r.pipeline(transaction=False)
    for tag in tags:
        pipe.zcard(keys.queue(tag))
        pipe.zcard(keys.leases(tag))
        pipe.zcard(keys.dead(tag))
        pipe.exists(keys.paused(tag))
        pipe.get(keys.seq(tag))
    replies = await pipe.execute()
    return {tag: replies[i * 5 : i * 5 + 5] for i, tag in enumerate(tags)}


async def _band_depths(
    r: redis.asyncio.Redis, keys: Keys, tags: list[str]
) -> dict[str, dict[int, int]]:
    pipe = r.pipeline(transaction=False)
    for tag in tags:
        for priority in PRIORITIES:
            for fresh in (0, 1):
                pipe.zcount(keys.queue(tag), *band_range(priority, fresh))
    replies = iter(await pipe.execute())
    counts = {tag: {p: int(next(replies)) + int(next(replies)) for p in PRIORITIES} for tag in tags}
    return {tag: {p: n for p, n in by_p.items() if n} for tag, by_p in counts.items()}


async def _oldest_ages(
    r: redis.asyncio.Redis, keys: Keys, depths: dict[str, dict[int, int]], now_ms: int
) -> dict[tuple[str, int], float]:
    slots = [(tag, p) for tag, by_p in depths.items() for p in by_p]
    heads = await _band_heads(r, keys, slots)
    pipe = r.pipeline(transaction=False)
    for rid in (rid for ids in heads for rid in ids):
        pipe.hget(keys.request(rid), "created_ms")
    created = iter(await pipe.execute())
    ages: dict[tuple[str, int], float] = {}
    for slot, ids in zip(slots, heads, strict=True):
        stamps = [ms for ms in (int_or_none(next(created)) for _ in ids) if ms is not None]
        if stamps:
            ages[slot] = max(0.0, (now_ms - min(stamps)) / 1000)
    return ages


async def _band_heads(
    r: redis.asyncio.Redis, keys: Keys, slots: list[tuple[str, int]]
) -> list[list[str]]:
    """The first member of each band (requeued, new) of each (tag, priority)."""
    pipe = r.pipeline(transaction=False)
    for tag, p in slots:
        for fresh in (0, 1):
            pipe.zrange(keys.queue(tag), *band_range(p, fresh), byscore=True, offset=0, num=1)
    found = await pipe.execute()
    return [[text(m) for m in found[2 * i] + found[2 * i + 1]] for i in range(len(slots))]


def _stats(
    tag: str,
    model: str,
    totals: list[Any],
    depths: dict[int, int],
    ages: dict[tuple[str, int], float],
) -> QueueStats:
    depth, running, dead, paused, seq = totals
    priorities = [
        PriorityDepth(priority=p, name=priority_name(p), depth=n, oldest_age_s=ages.get((tag, p)))
        for p, n in sorted(depths.items(), reverse=True)
    ]
    return QueueStats(
        model=model,
        tag=tag,
        paused=bool(paused),
        depth=int(depth),
        running=int(running),
        dead=int(dead),
        enqueued=int_or_none(seq) or 0,
        priorities=priorities,
    )
