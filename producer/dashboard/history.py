"""Chart history kept in Redis: one snapshot per interval on a capped stream.

Every gateway runs a sampler; a short lock (SET NX PX, a little under one interval)
lets one of them take each snapshot, so several gateways draw the same charts and the
history never grows past ``history_len`` entries.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from typing import Any

import orjson
import redis.asyncio

from producer.dashboard.config import DashboardConfig
from producer.dashboard.queues import QueueStats, known_models, queue_stats
from producer.dashboard.values import int_or_none, redis_ms
from producer.dashboard.workers import WorkerRow, worker_rows
from shared.keys import Keys
from shared.replies import text

log = logging.getLogger("producer.dashboard")
MAX_TTFT_PER_MODEL = 500


class Sampler:
    def __init__(self, r: redis.asyncio.Redis, keys: Keys, config: DashboardConfig) -> None:
        self.redis = r
        self.keys = keys
        self.dkeys = Keys(keys.namespace)
        self.config = config
        self.owner = secrets.token_hex(8)

    async def run(self) -> None:
        """Sample every interval until cancelled; errors are logged and sampling goes on."""
        while True:
            try:
                await self.sample_if_due()
            except redis.RedisError as e:
                log.warning("dashboard sampler: %s; retrying", e)
            except Exception:
                # Keep sampling: one unreadable record must not stop the charts for good.
                log.exception("dashboard sampler failed; retrying")
            await asyncio.sleep(self.config.sample_interval_s)

    async def sample_if_due(self) -> bool:
        """Take a snapshot unless another process holds this interval's lock."""
        lock_ms = max(100, int(self.config.sample_interval_s * 900))
        if not await self.redis.set(
            self.dkeys.dashboard_sampler_lock(), self.owner, nx=True, px=lock_ms
        ):
            return False
        await self.append(await self.snapshot())
        return True

    async def append(self, snapshot: dict[str, Any]) -> None:
        await self.redis.xadd(
            self.dkeys.dashboard_history(),
            {"s": orjson.dumps(snapshot)},
            maxlen=self.config.history_len,
            approximate=True,
        )

    async def snapshot(self) -> dict[str, Any]:
        now_ms = redis_ms(await self.redis.time())
        models = await known_models(self.redis, self.keys, self.config.max_models)
        queues = await queue_stats(self.redis, self.keys, models, now_ms)
        workers = await worker_rows(
            self.redis, self.keys, now_ms, self.config.history_s, self.config.max_workers
        )
        since_ms = await self._last_upto(now_ms)
        return {
            "t": now_ms,
            "queues": {q.model: _queue_sample(q) for q in queues},
            "workers": {w.id: _worker_sample(w) for w in workers if w.alive},
            "ttft": await self._ttft(models, since_ms, now_ms),
        }

    async def _last_upto(self, now_ms: int) -> int:
        last = await latest(self.redis, self.dkeys)
        fallback = now_ms - int(self.config.sample_interval_s * 1000)
        return fallback if last is None else max(fallback - 60_000, int(last["t"]))

    async def _ttft(self, models: dict[str, str], since_ms: int, now_ms: int) -> dict[str, Any]:
        """TTFT percentiles of the requests that ended in (since_ms, now_ms], per model."""
        ended = await self._ended(list(models), since_ms, now_ms)
        pipe = self.redis.pipeline(transaction=False)
        for rid in (rid for ids in ended.values() for rid in ids):
            pipe.hmget(self.keys.request(rid), ["created_ms", "first_token_ms"])
        stamps = iter(await pipe.execute())
        out: dict[str, Any] = {}
        for tag, ids in ended.items():
            seconds = [s for s in (_ttft_s(next(stamps)) for _ in ids) if s is not None]
            if seconds:
                out[models[tag]] = percentiles(seconds)
        return out

    async def _ended(self, tags: list[str], since_ms: int, now_ms: int) -> dict[str, list[str]]:
        pipe = self.redis.pipeline(transaction=False)
        for tag in tags:
            pipe.zrangebyscore(
                self.keys.recent(tag), f"({since_ms}", now_ms, start=0, num=MAX_TTFT_PER_MODEL
            )
        found = await pipe.execute()
        return {tag: [text(m) for m in ids] for tag, ids in zip(tags, found, strict=True)}


def _queue_sample(q: QueueStats) -> dict[str, Any]:
    depths = {str(p.priority): p.depth for p in q.priorities}
    return {"depth": q.depth, "enqueued": q.enqueued, "running": q.running, "p": depths}


def _worker_sample(w: WorkerRow) -> dict[str, Any]:
    return {"model": w.model, "tps": w.tokens_per_s, "running": w.running, "kv": w.kv_cache_usage}


def _ttft_s(pair: list[Any]) -> float | None:
    created, first = (int_or_none(v) for v in pair)
    return None if created is None or first is None else (first - created) / 1000


def percentiles(values: list[float]) -> dict[str, float]:
    """Nearest-rank p50, p90 and p99, with the count."""
    ordered = sorted(values)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[min(n, max(1, math.ceil(round(q * n, 9)))) - 1]

    return {"p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "n": n}


async def latest(r: redis.asyncio.Redis, dkeys: Keys) -> dict[str, Any] | None:
    entries: Any = await r.xrevrange(dkeys.dashboard_history(), count=1)
    return _decode(entries[0]) if entries else None


async def history(
    r: redis.asyncio.Redis, dkeys: Keys, window_s: float, now_ms: int, count: int
) -> list[dict[str, Any]]:
    """Snapshots of the last ``window_s``, oldest first, at most ``count``."""
    start = max(0, now_ms - int(window_s * 1000))
    entries: Any = await r.xrevrange(dkeys.dashboard_history(), "+", start, count=count)
    return [_decode(e) for e in reversed(entries)]


def _decode(entry: Any) -> dict[str, Any]:
    _entry_id, fields = entry
    data = fields.get(b"s", fields.get("s"))
    value: dict[str, Any] = orjson.loads(data)
    return value
