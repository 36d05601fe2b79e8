"""The worker registry and the served-model markers, as every part reads them."""

from __future__ import annotations

import time
from typing import Any

import redis

from shared.keys import Keys, model_tag
from shared.limits import register_limits
from shared.replies import text
from shared.settings import Settings

# Registry fields: the worker's ModelLimits JSON, and 1 when it serves structured outputs.
LIMITS_FIELD = "limits"
GUIDED_FIELD = "guided"
# A worker's ``state`` field once its engine is loaded and has passed its self-check
# (before that ``loading``; ``draining`` while it stops).
SERVING_STATE = "serving"
# Enough for any real fleet; bounds the work of whoever sweeps or lists all models.
KNOWN_MODELS_LIMIT = 1000


def mark_served(pipe: Any, keys: Keys, settings: Settings, model: str, guided: bool = True) -> None:
    """Queue the commands that say ``model`` has a worker (enqueue.lua reads this), and
    with ``guided`` one that serves structured outputs (for ``guided_ttl_ms``)."""
    tag = model_tag(model)
    pipe.set(keys.served(tag), model, ex=settings.served_ttl_s)
    pipe.hset(keys.models(), tag, model)
    pipe.delete(keys.load_failure(tag))
    if guided:
        pipe.set(keys.guided_served(tag), model, px=guided_ttl_ms(settings))


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
    model = str(fields["model"])
    # A worker of before capabilities were registered serves structured outputs.
    mark_served(pipe, keys, settings, model, guided=fields.get(GUIDED_FIELD, 1) == 1)
    if LIMITS_FIELD in fields:
        register_limits(pipe, keys, model, worker_id, str(fields[LIMITS_FIELD]))


def guided_ttl_ms(settings: Settings) -> int:
    """How long a worker's word that it serves structured outputs holds: a few missed
    beats, and at least a minute (a rolling restart does not refuse them meanwhile)."""
    return max(settings.worker_heartbeat_ms * 5, 60_000)


def known_models(connection: redis.Redis, keys: Keys) -> dict[str, str]:
    """Tag -> model name for every model a worker has ever registered."""
    raw = connection.hgetall(keys.models())
    return {text(k): text(v) for k, v in raw.items()}


def live_workers_of(connection: redis.Redis, keys: Keys, model: str) -> list[str]:
    """Ids of the registered workers (entries not yet expired) that serve ``model``."""
    ids = [text(i) for i in connection.zrange(keys.workers(), 0, -1)]
    pipe = connection.pipeline(transaction=False)
    for worker_id in ids:
        pipe.hget(keys.worker(worker_id), "model")
    models = pipe.execute() if ids else []
    return [i for i, m in zip(ids, models, strict=True) if m is not None and text(m) == model]


def withdraw_failed_worker(
    connection: redis.Redis, keys: Keys, settings: Settings, worker_id: str, model: str, reason: str
) -> None:
    """A worker that could not load ``model`` takes back what it registered; when no other
    worker serves the model, its served marker goes and ``reason`` stays (for
    ``settings.result_ttl_s``), so a submit for the model is refused with it
    (enqueue.lua) rather than queued for a worker that will never come."""
    connection.delete(keys.worker(worker_id))
    connection.zrem(keys.workers(), worker_id)
    if live_workers_of(connection, keys, model):
        return
    tag = model_tag(model)
    pipe = connection.pipeline(transaction=False)
    pipe.delete(keys.served(tag))
    pipe.set(keys.load_failure(tag), reason, ex=settings.result_ttl_s)
    pipe.execute()
