"""The models live workers serve, read from the worker registry and cached briefly.

A worker is live while its hash ``Keys.worker(id)`` exists (it expires after a few
missed heartbeats); the ``Keys.workers()`` sorted set lists the ids to look at.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import redis.asyncio

from shared.chat import REGISTRY_FIELD, ChatFeatures
from shared.keys import Keys
from shared.replies import text

MAX_WORKERS_READ = 10_000


@dataclass(frozen=True)
class LiveModel:
    name: str
    num_workers: int
    created_s: int  # earliest heartbeat seen among its workers, unix s
    # The smallest embedding length its workers report (their hidden size); None when
    # none reports one (a simulated model, or workers from before they did).
    embedding_size: int | None = None
    # What its chat template does with tools and reasoning (shared.chat); None when no
    # worker says (a simulated model, one still loading, or workers from before).
    chat: ChatFeatures | None = None


class ModelRegistry:
    def __init__(self, redis_client: redis.asyncio.Redis, keys: Keys, cache_s: float = 1.0) -> None:
        self._redis = redis_client
        self._keys = keys
        self._cache_s = cache_s
        self._models: dict[str, LiveModel] = {}
        self._read_at = -float("inf")

    async def live(self) -> dict[str, LiveModel]:
        """Live models by name (at most ``cache_s`` old)."""
        if time.monotonic() - self._read_at > self._cache_s:
            self._models = await self._read()
            self._read_at = time.monotonic()
        return self._models

    async def _read(self) -> dict[str, LiveModel]:
        ids: list[Any] = await self._redis.zrange(
            self._keys.workers(), 0, MAX_WORKERS_READ - 1, withscores=True
        )
        if not ids:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for worker_id, _ in ids:
            fields = ["model", "embedding_size", REGISTRY_FIELD]
            pipe.hmget(self._keys.worker(text(worker_id)), fields)
        replies = await pipe.execute()
        models: dict[str, LiveModel] = {}
        for (_, score), (model, size, chat) in zip(ids, replies, strict=True):
            if model is None:
                continue  # its hash expired: the worker is gone
            name = text(model)
            found = _counted(models.get(name), name, int(score), size)
            models[name] = replace(found, chat=found.chat or ChatFeatures.from_field(chat))
        return models


def _counted(known: LiveModel | None, name: str, seen_s: int, raw_size: bytes | None) -> LiveModel:
    """``known`` with one more worker, seen at ``seen_s``, whose embeddings are
    ``raw_size`` long (if it says)."""
    size = int(raw_size) if raw_size else None
    if known is None:
        return LiveModel(name, 1, seen_s, size)
    sizes = [s for s in (known.embedding_size, size) if s is not None]
    first_s = min(known.created_s, seen_s)
    return LiveModel(name, known.num_workers + 1, first_s, min(sizes, default=None), known.chat)
