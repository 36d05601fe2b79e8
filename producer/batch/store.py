"""The batch record in Redis: create it, read its status, read its lines and results."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson
import redis

from producer.batch.context import Context
from producer.batch.lines import BatchLine
from producer.batch.models import BatchCounts, BatchState, BatchStatus
from producer.paging import Page, page
from shared.errors import NotFound
from shared.keys import new_batch_id
from shared.replies import text

CHUNK = 500
COMPLETION_WINDOW = "24h"  # the one window OpenAI offers
COMPLETION_WINDOW_S = 24 * 3600
Results = tuple[list[bytes], list[bytes]]


def now_us(ctx: Context) -> int:
    """Redis's clock in microseconds, like the Lua scripts, so hosts agree."""
    seconds, micros = ctx.redis.time()
    return int(seconds) * 1_000_000 + int(micros)


def now_ms(ctx: Context) -> int:
    return now_us(ctx) // 1000


def create(
    ctx: Context,
    pipe: redis.client.Pipeline,
    lines: Sequence[BatchLine],
    priority: int,
    webhook_url: str | None,
    tenant: str | None = None,
    details: Mapping[str, str] | None = None,
) -> str:
    """Queue the commands that write a new batch on ``pipe``; returns its id. Its
    ``details`` (OpenAI's endpoint, input_file_id, metadata as JSON) are kept as given."""
    batch_id, created_us = new_batch_id(), now_us(ctx)
    created = created_us // 1000
    meta: dict[str, str | int] = {
        **(details or {}),
        "expires_ms": created + COMPLETION_WINDOW_S * 1000,
        "state": BatchState.IN_PROGRESS.value,
        "priority": priority,
        "total": len(lines),
        "cursor": 0,
        "created_ms": created,
        "webhook_url": webhook_url or "",
        "tenant": tenant or "",
    }
    pipe.hset(ctx.bkeys.meta(batch_id), mapping=meta)  # type: ignore[arg-type]
    for start in range(0, len(lines), CHUNK):
        pipe.rpush(ctx.bkeys.lines(batch_id), *(x.to_json() for x in lines[start : start + CHUNK]))
    # Listed by the microsecond: batches made in one millisecond still come newest first
    # (an index scored in milliseconds by an earlier version sorts below, as it is older).
    pipe.zadd(ctx.bkeys.batches(), {batch_id: created_us})
    return batch_id


def meta(ctx: Context, batch_id: str, scope: str | None = None) -> dict[str, str]:
    """The batch record; NotFound if it is gone or, with a ``scope`` (a tenant), if
    another tenant created it."""
    raw = ctx.redis.hgetall(ctx.bkeys.meta(batch_id))
    m = {text(k): text(v) for k, v in raw.items()}
    if not m or (scope is not None and m.get("tenant") != scope):
        raise NotFound(f"batch {batch_id} does not exist (or has expired)")
    return m


def status(ctx: Context, batch_id: str, scope: str | None = None) -> BatchStatus:
    k = ctx.bkeys
    pipe = ctx.redis.pipeline(transaction=False)
    for key in (k.outputs(batch_id), k.errors(batch_id), k.pending(batch_id)):
        pipe.hlen(key)
    completed, failed, in_flight = pipe.execute()
    m = meta(ctx, batch_id, scope)
    counts = BatchCounts(
        total=int(m["total"]), completed=completed, failed=failed, in_flight=in_flight
    )
    return BatchStatus(
        id=batch_id,
        state=BatchState(m["state"]),
        priority=int(m["priority"]),
        counts=counts,
        submitted=int(m["cursor"]),
        created_ms=int(m["created_ms"]),
        finished_ms=int(m["finished_ms"]) if m.get("finished_ms") else None,
        webhook_url=m["webhook_url"] or None,
        error=m.get("error") or None,
        tenant=m.get("tenant") or None,
        **_openai_fields(m),
    )


def _openai_fields(m: dict[str, str]) -> dict[str, Any]:
    """What the OpenAI batch object shows beside the status, as kept in the record."""
    stamps = ("finalizing_ms", "cancelling_ms", "expires_ms")
    found: dict[str, Any] = {k: int(m[k]) for k in stamps if m.get(k)}
    ids = ("endpoint", "input_file_id", "output_file_id", "error_file_id")
    found |= {k: m[k] for k in ids if m.get(k)}
    if m.get("metadata"):
        found["metadata"] = orjson.loads(m["metadata"])
    return found


def read_lines(ctx: Context, batch_id: str, start: int, num: int) -> list[BatchLine]:
    raw = ctx.redis.lrange(ctx.bkeys.lines(batch_id), start, start + num - 1)
    return [BatchLine.from_json(r) for r in raw]


def iter_lines(ctx: Context, batch_id: str, start: int = 0) -> Iterator[list[BatchLine]]:
    while chunk := read_lines(ctx, batch_id, start, CHUNK):
        yield chunk
        start += len(chunk)


def results(ctx: Context, batch_id: str, scope: str | None = None) -> Results:
    """(output lines, error lines), each in input order."""
    meta(ctx, batch_id, scope)  # raises NotFound
    outputs: list[bytes] = []
    errors: list[bytes] = []
    for chunk in iter_lines(ctx, batch_id):
        ids = [line.custom_id for line in chunk]
        pipe = ctx.redis.pipeline(transaction=False)
        pipe.hmget(ctx.bkeys.outputs(batch_id), ids)
        pipe.hmget(ctx.bkeys.errors(batch_id), ids)
        out, err = pipe.execute()
        outputs += [x for x in out if x is not None]
        errors += [x for x in err if x is not None]
    return outputs, errors


def list_batches(ctx: Context, limit: int = 50, scope: str | None = None) -> list[BatchStatus]:
    """The newest batches first (with a ``scope``, only that tenant's)."""
    return page_batches(ctx, limit=limit, scope=scope).items


def page_batches(
    ctx: Context, *, limit: int, scope: str | None = None, after: str | None = None
) -> Page[BatchStatus]:
    """A page of batches, newest first, from the one after ``after`` (with a ``scope``,
    only that tenant's); ones that expired are left out, and dropped from the index."""

    def load(ids: Sequence[str]) -> list[BatchStatus]:
        return _load(ctx, ids, scope)

    return page(ctx.redis, ctx.bkeys.batches(), load, after=after, limit=limit, newest_first=True)


def _load(ctx: Context, ids: Sequence[str], scope: str | None) -> list[BatchStatus]:
    found: list[BatchStatus] = []
    expired: list[str] = []
    for batch_id in ids:
        try:
            found.append(status(ctx, batch_id, scope))
        except NotFound:  # another tenant's, or expired
            if not ctx.redis.exists(ctx.bkeys.meta(batch_id)):
                expired.append(batch_id)
    if expired:
        ctx.redis.zrem(ctx.bkeys.batches(), *expired)
    return found
