"""Per-request webhooks: a watcher (a chain of RQ jobs) reports requests as they end.

``submit_with_webhook`` puts the URL in the request's ``metadata["webhook_url"]``
(so dashboards show it) and in the watched set, which the watcher sweeps; it
leaves the wire schema and the tokenq worker as they are.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
import redis

from producer.batch import chain, webhooks
from producer.batch.context import Context, batch_redis
from producer.client import Client, Handle
from producer.requests import validate_request
from shared.errors import NotFound
from shared.keys import tag_of
from shared.models import GenerationRequest
from shared.records import RESULT_FIELDS, decode_hash, result_from_hash
from shared.replies import text
from shared.settings import Settings

WATCH_FUNC = "producer.batch.jobs.watch_requests"
SWEEP_CHUNK = 500


def watcher_chain(ctx: Context) -> chain.Chain:
    return chain.Chain(ctx.bkeys.watcher(), WATCH_FUNC, (), "watcher")


def submit_with_webhook(
    client: Client,
    request: GenerationRequest | Mapping[str, Any],
    url: str,
    settings: Settings | None = None,
) -> Handle:
    """Submit a request and POST its result to ``url`` (signed) once it ends."""
    s = settings or client.settings
    ctx = Context(batch_redis(s, client.redis), s, client.redis)
    webhooks.check_url(url)
    webhooks.require_secret(ctx)
    req = validate_request(client.settings, request)
    metadata = {**req.metadata, "webhook_url": url}
    req = validate_request(client.settings, {**req.model_dump(), "metadata": metadata})
    handle = client.submit_request(req)
    watch(ctx, handle.id, url)
    return handle


def watch(ctx: Context, request_id: str, url: str) -> None:
    """Send a webhook to ``url`` when the request ends (at once if it already has)."""
    tag_of(request_id)
    ctx.redis.hset(ctx.bkeys.watched(), request_id, webhooks.check_url(url))
    chain.ensure(ctx, watcher_chain(ctx))


def run_tick(ctx: Context, job_id: str) -> bool:
    """Sweep for about ``batch_tick_s``; True when this chain should end."""
    give_up, link = time.monotonic() + ctx.settings.batch_tick_s, watcher_chain(ctx)
    with ctx.main.pubsub(ignore_subscribe_messages=True) as wakeups:  # type: ignore[no-untyped-call]
        wakeups.subscribe(ctx.keys.lifecycle_channel())
        while chain.is_driver(ctx, link, job_id):
            sweep(ctx)
            if _stop_if_idle(ctx, job_id):
                return True
            left_s = give_up - time.monotonic()
            if left_s <= 0:
                return False
            wakeups.get_message(timeout=min(left_s, ctx.settings.batch_poll_s))
    return True


def sweep(ctx: Context) -> int:
    """Send webhooks for watched requests that have ended; returns how many."""
    watched, sent = _watched(ctx), 0
    pipe = ctx.main.pipeline(transaction=False)
    for request_id in watched:
        pipe.hmget(ctx.keys.request(request_id), [*RESULT_FIELDS])
    for (request_id, url), raw in zip(watched.items(), pipe.execute(), strict=True):
        data = _ended(request_id, raw)
        if data is not None:
            webhooks.send(ctx, f"req-{request_id}", url, f"request.{data['state']}", data)
            ctx.redis.hdel(ctx.bkeys.watched(), request_id)
            sent += 1
    return sent


def _watched(ctx: Context) -> dict[str, str]:
    raw = ctx.redis.hgetall(ctx.bkeys.watched())
    return {text(k): text(v) for k, v in list(raw.items())[:SWEEP_CHUNK]}


def _ended(request_id: str, raw: list[Any]) -> dict[str, Any] | None:
    fields = decode_hash(raw, RESULT_FIELDS)
    try:
        result = result_from_hash(request_id, fields)
    except NotFound:
        return {"state": "expired", "request_id": request_id, "result": None}
    if result is None:
        return None
    return {
        "state": fields["state"],
        "request_id": request_id,
        "result": orjson.loads(result.model_dump_json()),
    }


def _stop_if_idle(ctx: Context, job_id: str) -> bool:
    """End the chain when nothing is watched; a watch added meanwhile keeps it going."""
    keys = (ctx.bkeys.watched(), ctx.bkeys.watcher())
    with ctx.redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(*keys)  # type: ignore[no-untyped-call]
            if pipe.hlen(keys[0]) or text(pipe.hget(keys[1], chain.DRIVER) or b"") != job_id:
                return False
            pipe.multi()
            pipe.delete(keys[1])
            pipe.execute()
            return True
        except redis.WatchError:
            return False
