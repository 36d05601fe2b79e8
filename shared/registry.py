"""The worker registry and the served-model markers, as every part reads them."""

from __future__ import annotations

import time
from typing import Any

import redis

from shared.keys import Keys, model_tag
from shared.replies import text
from shared.settings import Settings

# Enough for any real fleet; bounds the work of whoever sweeps or lists all models.
KNOWN_MODELS_LIMIT = 1000


def mark_served(pipe: Any, keys: Keys, settings: Settings, model: str) -> None:
    """Queue the commands that say ``model`` has a worker (enqueue.lua reads this)."""
    tag = model_tag(model)
    pipe.set(keys.served(tag), model, ex=settings.served_ttl_s)
    pipe.hset(keys.models(), tag, model)


def register_worker(
    pipe: Any, keys: Keys, settings: Settings, worker_id: str, fields: dict[str, Any]
) -> None:
    """Queue the commands of one beat: the worker's registry entry (``fields`` must hold
    its ``model``; it expires after a few missed beats) and its model's served marker."""
    key = keys.worker(worker_id)
    entry = {**fields, "heartbeat_ms": int(time.time() * 1000)}
    pipe.hset(key, mapping={k: str(v) for k, v in entry.items()})
    pipe.pexpire(key, settings.worker_heartbeat_ms * 5)
    pipe.zadd(keys.workers(), {worker_id: time.time()})
    mark_served(pipe, keys, settings, str(fields["model"]))


def known_models(connection: redis.Redis, keys: Keys) -> dict[str, str]:
    """Tag -> model name for every model a worker has ever registered."""
    raw = connection.hgetall(keys.models())
    return {text(k): text(v) for k, v in raw.items()}
