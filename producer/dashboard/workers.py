"""Live and recently dead workers from the registry.

A worker's hash expires a few heartbeats after it stops beating while its entry in
the workers zset stays: in the zset with no hash is "recently dead".
"""

from __future__ import annotations

from typing import Any

import redis.asyncio
from pydantic import BaseModel

from producer.dashboard.values import decoded, float_or_none, int_or_none
from shared.keys import Keys
from shared.replies import text


class WorkerRow(BaseModel):
    id: str
    alive: bool
    last_heartbeat_ms: int
    heartbeat_age_s: float
    model: str | None = None
    version: str | None = None
    pid: int | None = None
    device: str | None = None
    state: str = "dead"
    max_num_seqs: int | None = None
    running: int = 0
    occupancy: float | None = None
    kv_cache_usage: float | None = None
    prefix_cache_hit_rate: float | None = None
    waiting: int | None = None  # in the engine's own scheduler
    preemptions: int | None = None  # since the worker started
    spec_acceptance_rate: float | None = None  # share of drafted tokens kept, when it drafts
    affinity_claims: int | None = None  # requests it claimed for a warm prefix
    kv_cache_mib: int | None = None
    tokens_per_s: float = 0.0


async def worker_rows(
    r: redis.asyncio.Redis, keys: Keys, now_ms: int, window_s: float, limit: int
) -> list[WorkerRow]:
    """Workers that beat within ``window_s``, most recent first, at most ``limit``."""
    since_s = now_ms / 1000 - window_s
    entries: list[Any] = await r.zrevrangebyscore(
        keys.workers(), "+inf", since_s, start=0, num=limit, withscores=True
    )
    pipe = r.pipeline(transaction=False)
    for member, _ in entries:
        pipe.hgetall(keys.worker(text(member)))
    hashes = await pipe.execute()
    rows = [
        _row(text(member), float(score), decoded(h), now_ms)
        for (member, score), h in zip(entries, hashes, strict=True)
    ]
    return sorted(rows, key=lambda w: (not w.alive, w.model or "", w.id))


def _row(worker_id: str, beat_s: float, h: dict[str, str], now_ms: int) -> WorkerRow:
    beat_ms = int_or_none(h.get("heartbeat_ms")) or int(beat_s * 1000)
    age_s = max(0.0, (now_ms - beat_ms) / 1000)
    if not h:
        return WorkerRow(
            id=worker_id, alive=False, last_heartbeat_ms=beat_ms, heartbeat_age_s=age_s
        )
    max_seqs = int_or_none(h.get("max_num_seqs"))
    running = int_or_none(h.get("running")) or 0
    return WorkerRow(
        id=worker_id,
        alive=True,
        last_heartbeat_ms=beat_ms,
        heartbeat_age_s=age_s,
        model=h.get("model"),
        version=h.get("version"),
        pid=int_or_none(h.get("pid")),
        device=h.get("device"),
        state=h.get("state", "serving"),
        max_num_seqs=max_seqs,
        running=running,
        occupancy=running / max_seqs if max_seqs else None,
        kv_cache_usage=float_or_none(h.get("kv_cache_usage")),
        prefix_cache_hit_rate=float_or_none(h.get("prefix_cache_hit_rate")),
        waiting=int_or_none(h.get("waiting")),
        preemptions=int_or_none(h.get("preemptions")),
        spec_acceptance_rate=float_or_none(h.get("spec_acceptance_rate")),
        affinity_claims=int_or_none(h.get("affinity_claims")),
        kv_cache_mib=int_or_none(h.get("kv_cache_mib")),
        tokens_per_s=float_or_none(h.get("tokens_per_s")) or 0.0,
    )
