"""Webhook deliveries: a record per delivery in Redis, sent by an RQ job that RQ retries
with backoff; one whose retries ran out is listed as failed and can be sent again.

Every attempt of one delivery carries the same ``X-Tokenq-Delivery`` id, so a
receiver that answered 2xx to an attempt whose reply was lost can drop the repeat.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from enum import StrEnum
from typing import Any
from urllib.parse import urlparse

import orjson
import redis
from pydantic import BaseModel, ConfigDict
from rq import Retry

from producer.batch import store
from producer.batch.context import Context
from producer.batch.signing import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign,
)
from shared.errors import InvalidRequest, NotFound, TokenqError
from shared.replies import text

DELIVER_FUNC = "producer.batch.jobs.deliver_webhook"
MAX_URL_CHARS = 2048
MAX_ERROR_CHARS = 500


class WebhookFailed(TokenqError):
    """One attempt of a delivery failed (RQ retries it while retries are left)."""


class WebhookNotConfigured(TokenqError):
    """No signing secret: set TOKENQ_WEBHOOK_SECRET where batch jobs and RQ workers run."""


class DeliveryState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class Delivery(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    url: str
    event: str
    state: DeliveryState
    attempts: int = 0
    last_status: int | None = None
    last_error: str | None = None
    created_ms: int
    delivered_ms: int | None = None


def check_url(url: str) -> str:
    """The URL itself; raises InvalidRequest unless it is an absolute http(s) URL."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or len(url) > MAX_URL_CHARS:
        raise InvalidRequest(f"webhook URL {url!r}: give an absolute http:// or https:// URL")
    return url


def require_secret(ctx: Context) -> bytes:
    secret = ctx.settings.webhook_secret
    if secret is None or not secret.get_secret_value():
        raise WebhookNotConfigured(
            "webhooks need a signing secret: set TOKENQ_WEBHOOK_SECRET for the gateway, "
            "the CLI and the RQ workers"
        )
    return secret.get_secret_value().encode()


def send(ctx: Context, delivery_id: str, url: str, event: str, data: dict[str, Any]) -> bool:
    """Create the delivery and queue its first attempt; False if it already exists."""
    key, created = ctx.bkeys.delivery(delivery_id), store.now_ms(ctx)
    body = orjson.dumps({"id": delivery_id, "type": event, "created_ms": created, "data": data})
    record = {
        "url": check_url(url),
        "event": event,
        "body": body,
        "state": "pending",
        "attempts": 0,
        "created_ms": created,
    }
    with ctx.redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)  # type: ignore[no-untyped-call]
            if pipe.exists(key):
                return False
            pipe.multi()
            pipe.hset(key, mapping=record)  # type: ignore[arg-type]
            pipe.expire(key, ctx.settings.webhook_ttl_s)
            pipe.zadd(ctx.bkeys.deliveries(), {delivery_id: created})
            _enqueue(ctx, delivery_id, pipe)
            pipe.execute()
        except redis.WatchError:
            return False  # created by someone else meanwhile
    return True


def redeliver(ctx: Context, delivery_id: str) -> None:
    """Send a delivery again (after its retries ran out, say), with a fresh set of retries."""
    get(ctx, delivery_id)
    pipe = ctx.redis.pipeline(transaction=True)
    pipe.multi()  # before any command: RQ's enqueue asks for MULTI itself otherwise
    pipe.hset(ctx.bkeys.delivery(delivery_id), "state", DeliveryState.PENDING.value)
    pipe.zrem(ctx.bkeys.failed_deliveries(), delivery_id)
    _enqueue(ctx, delivery_id, pipe)
    pipe.execute()


def get(ctx: Context, delivery_id: str) -> Delivery:
    raw = ctx.redis.hgetall(ctx.bkeys.delivery(delivery_id))
    if not raw:
        raise NotFound(f"webhook delivery {delivery_id} does not exist (or has expired)")
    h = {text(k): text(v) for k, v in raw.items()}
    return Delivery(
        id=delivery_id,
        url=h["url"],
        event=h["event"],
        state=DeliveryState(h["state"]),
        attempts=int(h.get("attempts", 0)),
        last_status=_int(h.get("last_status")),
        last_error=h.get("last_error") or None,
        created_ms=int(h["created_ms"]),
        delivered_ms=_int(h.get("delivered_ms")),
    )


def list_deliveries(ctx: Context, *, failed_only: bool = False, limit: int = 50) -> list[Delivery]:
    key = ctx.bkeys.failed_deliveries() if failed_only else ctx.bkeys.deliveries()
    found = []
    for raw in ctx.redis.zrevrange(key, 0, limit - 1):
        try:
            found.append(get(ctx, text(raw)))
        except NotFound:
            ctx.redis.zrem(key, text(raw))
    return found


def deliver(ctx: Context, delivery_id: str, *, last_attempt: bool) -> DeliveryState:
    """One attempt; raises WebhookFailed on failure so that RQ retries it."""
    key = ctx.bkeys.delivery(delivery_id)
    delivery = get(ctx, delivery_id)
    if delivery.state is DeliveryState.DELIVERED:
        return DeliveryState.DELIVERED
    raw = ctx.redis.hget(key, "body") or b""
    body = raw.encode() if isinstance(raw, str) else raw
    try:
        status, error = post(delivery, body, require_secret(ctx), ctx.settings.webhook_timeout_s)
    except WebhookNotConfigured as e:
        status, error = None, str(e)
    if error is None:
        _record(ctx, delivery_id, status, "", DeliveryState.DELIVERED)
        return DeliveryState.DELIVERED
    state = DeliveryState.FAILED if last_attempt else DeliveryState.PENDING
    _record(ctx, delivery_id, status, error, state)
    raise WebhookFailed(f"webhook {delivery_id} to {delivery.url}: {error}")


def post(
    delivery: Delivery, body: bytes, secret: bytes, timeout_s: float
) -> tuple[int | None, str | None]:
    """(HTTP status or None, error or None); redirects count as failures."""
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "tokenq-webhooks",
        SIGNATURE_HEADER: sign(secret, body, timestamp),
        TIMESTAMP_HEADER: str(timestamp),
        DELIVERY_HEADER: delivery.id,
        EVENT_HEADER: delivery.event,
    }
    request = urllib.request.Request(delivery.url, data=body, headers=headers, method="POST")
    try:
        with _opener().open(request, timeout=timeout_s) as response:
            return int(response.status), None
    except urllib.error.HTTPError as e:
        return e.code, f"answered HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return None, f"could not connect: {e}"[:MAX_ERROR_CHARS]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(_NoRedirect)


def _record(
    ctx: Context, delivery_id: str, status: int | None, error: str, state: DeliveryState
) -> None:
    key, at_ms = ctx.bkeys.delivery(delivery_id), store.now_ms(ctx)
    pipe = ctx.redis.pipeline(transaction=True)
    pipe.hincrby(key, "attempts", 1)
    pipe.hset(
        key,
        mapping={
            "last_status": status or "",
            "last_error": error,
            "state": state.value,
            "last_attempt_ms": at_ms,
        },
    )
    if state is DeliveryState.DELIVERED:
        pipe.hset(key, "delivered_ms", at_ms)
    if state is DeliveryState.FAILED:
        pipe.zadd(ctx.bkeys.failed_deliveries(), {delivery_id: at_ms})
    pipe.execute()


def _enqueue(ctx: Context, delivery_id: str, pipe: redis.client.Pipeline) -> None:
    intervals = list(ctx.settings.webhook_retry_s)
    retry = Retry(max=len(intervals), interval=intervals) if intervals else None
    timeout_s = int(ctx.settings.webhook_timeout_s) + 30
    ctx.webhook_queue().enqueue_call(
        DELIVER_FUNC,
        args=[delivery_id],
        retry=retry,
        timeout=timeout_s,
        result_ttl=600,
        failure_ttl=ctx.settings.webhook_ttl_s,
        description=f"webhook {delivery_id}",
        pipeline=pipe,
    )


def _int(value: str | None) -> int | None:
    return int(value) if value else None
