"""The dashboard's state in one process: its Redis connection, scripts, the sampler
task, and the overview shared by every viewer of this process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio
from pydantic import BaseModel

from producer.dashboard.actions import AsyncAdmin
from producer.dashboard.batches import BatchRow, UsageRow, batch_rows, usage_rows
from producer.dashboard.config import DashboardConfig
from producer.dashboard.history import Sampler, history, latest
from producer.dashboard.queues import QueueStats, known_models, queue_stats
from producer.dashboard.requests import LIST_KINDS, RequestRow, request_list
from producer.dashboard.values import redis_ms
from producer.dashboard.workers import WorkerRow, worker_rows
from shared.keys import BatchKeys, Keys
from shared.replication import Replicas
from shared.scripts import AsyncScripts
from shared.settings import Settings

RedisSource = redis.asyncio.Redis | Callable[[], redis.asyncio.Redis]
RATE_WINDOW_S = 60.0


class Overview(BaseModel):
    t: int
    queues: list[QueueStats]
    workers: list[WorkerRow]
    lists: dict[str, list[RequestRow]]
    batches: list[BatchRow] = []
    usage: list[UsageRow] = []


class Dashboard:
    def __init__(self, settings: Settings, config: DashboardConfig, source: RedisSource) -> None:
        self.settings = settings
        self.config = config
        self.keys = Keys(settings.namespace)
        self.dkeys = Keys(settings.namespace)
        self.bkeys = BatchKeys(settings.namespace)
        self._source = source
        self._redis: redis.asyncio.Redis | None = None
        self._scripts: AsyncScripts | None = None
        self._overview: tuple[float, Overview] | None = None
        self._overview_lock = asyncio.Lock()

    @property
    def redis(self) -> redis.asyncio.Redis:
        """The connection, resolved on first use (the host app may open it at startup)."""
        if self._redis is None:
            source = self._source
            self._redis = source if isinstance(source, redis.asyncio.Redis) else source()
        return self._redis

    @property
    def admin(self) -> AsyncAdmin:
        if self._scripts is None:
            self._scripts = AsyncScripts(self.redis, Replicas.of(self.settings))
        return AsyncAdmin(self.redis, self.keys, self.settings, self._scripts)

    @asynccontextmanager
    async def lifespan(self, _app: Any) -> AsyncIterator[None]:
        """Runs the history sampler for as long as the app serves."""
        task = asyncio.create_task(Sampler(self.redis, self.keys, self.config).run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def now_ms(self) -> int:
        return redis_ms(await self.redis.time())

    async def tags(self) -> dict[str, str]:
        return await known_models(self.redis, self.keys, self.config.max_models)

    async def overview(self) -> Overview:
        """Built at most once per push interval in this process, however many watch."""
        async with self._overview_lock:
            cached = self._overview
            if cached is not None and time.monotonic() - cached[0] < self.config.push_interval_s:
                return cached[1]
            built = await self._build_overview()
            self._overview = (time.monotonic(), built)
            return built

    def refresh(self) -> None:
        """Drop the shared overview, so the next one is read afresh."""
        self._overview = None

    async def _build_overview(self) -> Overview:
        now_ms = await self.now_ms()
        models = await self.tags()
        queues = await queue_stats(self.redis, self.keys, models, now_ms)
        await self._add_rates(queues, now_ms)
        workers = await worker_rows(
            self.redis, self.keys, now_ms, self.config.history_s, self.config.max_workers
        )
        tags, limit = list(models), self.config.list_limit
        lists = {k: await request_list(self.redis, self.keys, tags, k, limit) for k in LIST_KINDS}
        return Overview(
            t=now_ms,
            queues=queues,
            workers=workers,
            lists=lists,
            batches=await batch_rows(self.redis, self.bkeys, limit),
            usage=await usage_rows(self.redis, self.keys, now_ms / 1000),
        )

    async def _add_rates(self, queues: list[QueueStats], now_ms: int) -> None:
        """Rates over the last minute of history: in = enqueued/s; out = left the queue/s
        (claimed, cancelled or expired), i.e. enqueued minus the change in depth."""
        count = int(RATE_WINDOW_S / self.config.sample_interval_s) + 2
        samples = await history(self.redis, self.dkeys, RATE_WINDOW_S, now_ms, count)
        for q in queues:
            seen = [(s["t"], s["queues"][q.model]) for s in samples if q.model in s["queues"]]
            if len(seen) < 2 or seen[-1][0] <= seen[0][0]:
                continue
            (t0, a), (t1, b) = seen[0], seen[-1]
            dt_s, arrived = (t1 - t0) / 1000, b["enqueued"] - a["enqueued"]
            q.rate_in_per_s = round(arrived / dt_s, 3)
            q.rate_out_per_s = round(max(0, arrived - (b["depth"] - a["depth"])) / dt_s, 3)

    async def history(self, window_s: float) -> list[dict[str, Any]]:
        return await history(
            self.redis, self.dkeys, window_s, await self.now_ms(), self.config.history_len
        )

    async def latest_sample(self) -> dict[str, Any] | None:
        return await latest(self.redis, self.dkeys)
