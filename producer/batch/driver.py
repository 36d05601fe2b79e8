"""One tick of a batch: fan lines into tokenq's queue, collect what ended, finish.

Every step is safe to repeat after a crash: a line's request carries the
idempotency key ``<batch id>:<custom_id>``, so enqueueing it again returns the
request it already has instead of running it twice, and results are stored by
custom_id.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import redis

from producer.batch import store, webhooks
from producer.batch.context import Context
from producer.batch.lines import BatchLine
from producer.batch.models import BatchState
from producer.batch.output import error_line, result_line
from shared.errors import NotFound, UnknownModel
from shared.flows import Enqueued, drive, ended_flow, enqueue_flow
from shared.models import TENANT, GenerationRequest
from shared.records import RESULT_FIELDS, decode_hash, result_from_hash
from shared.replies import text

FAN_OUT_CHUNK = 100


def run_tick(ctx: Context, batch_id: str, job_id: str) -> bool:
    """Drive the batch for about ``batch_tick_s``; True once it has ended (or this job
    is no longer its driver), False when the next job should carry on."""
    give_up = time.monotonic() + ctx.settings.batch_tick_s
    with ctx.redis.pubsub(ignore_subscribe_messages=True) as wakeups:  # type: ignore[no-untyped-call]
        wakeups.subscribe(ctx.keys.lifecycle_channel())
        while True:
            m = store.meta(ctx, batch_id)
            if m.get("driver") != job_id or BatchState(m["state"]).terminal:
                return True
            if advance(ctx, batch_id, m):
                return True
            left_s = give_up - time.monotonic()
            if left_s <= 0:
                return False
            _wait(wakeups, min(left_s, ctx.settings.batch_poll_s))


def advance(ctx: Context, batch_id: str, m: dict[str, str]) -> bool:
    """One round; True once the batch has ended."""
    cancelling = BatchState(m["state"]) is BatchState.CANCELLING
    if cancelling:
        cancel_pending(ctx, batch_id)
    else:
        fan_out(ctx, batch_id, m)
    collect(ctx, batch_id)
    return _finish_if_done(ctx, batch_id, cancelling)


def fan_out(ctx: Context, batch_id: str, m: dict[str, str]) -> int:
    """Enqueue the next lines that fit; returns how many were taken."""
    cursor, total = int(m["cursor"]), int(m["total"])
    room = ctx.settings.batch_max_in_flight - int(ctx.redis.hlen(ctx.bkeys.pending(batch_id)))
    if room <= 0 or cursor >= total:
        return 0
    lines = store.read_lines(ctx, batch_id, cursor, min(room, FAN_OUT_CHUNK))
    tenant = m.get("tenant") or None
    requests = [_request(batch_id, int(m["priority"]), tenant, line) for line in lines]
    enqueued = drive(ctx.scripts, enqueue_flow(ctx.keys, ctx.settings, requests))
    return _record_fan_out(ctx, batch_id, cursor, lines, enqueued)


def _request(
    batch_id: str, priority: int, tenant: str | None, line: BatchLine
) -> GenerationRequest:
    metadata = {**line.request.metadata, "batch_id": batch_id, "custom_id": line.custom_id}
    if tenant is not None:  # whatever a line's own metadata claims
        metadata[TENANT] = tenant
    update = {
        "priority": priority,
        "idempotency_key": f"{batch_id}:{line.custom_id}",
        "metadata": metadata,
    }
    return line.request.model_copy(update=update)


def _record_fan_out(
    ctx: Context, batch_id: str, cursor: int, lines: list[BatchLine], enqueued: list[Enqueued]
) -> int:
    """Record what was enqueued; the cursor stops at the first line that did not fit.
    Lines after it that did fit (a worker made room meanwhile) are recorded too, so a
    cancel finds them; the next round enqueues them again and gets the same requests."""
    pending: dict[str, str] = {}
    failed: dict[str, bytes] = {}
    taken = len(lines)
    for i, (line, e) in enumerate(zip(lines, enqueued, strict=True)):
        if e.refused == "full":
            taken = min(taken, i)  # back off: the next round starts from this line
        elif e.refused:
            message = str(UnknownModel(line.request.model))
            failed[line.custom_id] = error_line(line.custom_id, "unknown_model", message)
        else:
            pending[line.custom_id] = f"{line.kind}:{e.request_id}"
    pipe = ctx.redis.pipeline(transaction=True)
    _hset(pipe, ctx.bkeys.pending(batch_id), pending)
    _hset(pipe, ctx.bkeys.errors(batch_id), failed)
    pipe.hset(ctx.bkeys.meta(batch_id), "cursor", cursor + taken)
    pipe.execute()
    return taken


def collect(ctx: Context, batch_id: str) -> int:
    """Store the results of lines whose requests have ended; returns how many."""
    pending = {text(k): text(v) for k, v in ctx.redis.hgetall(ctx.bkeys.pending(batch_id)).items()}
    pipe = ctx.redis.pipeline(transaction=False)
    for value in pending.values():
        pipe.hmget(ctx.keys.request(value.split(":", 1)[1]), RESULT_FIELDS)
    outputs: dict[str, bytes] = {}
    errors: dict[str, bytes] = {}
    for (custom_id, value), raw in zip(pending.items(), pipe.execute(), strict=True):
        ended = _ended(custom_id, value, raw)
        if ended is not None:
            (outputs if ended[0] else errors)[custom_id] = ended[1]
    pipe = ctx.redis.pipeline(transaction=True)
    _hset(pipe, ctx.bkeys.outputs(batch_id), outputs)
    _hset(pipe, ctx.bkeys.errors(batch_id), errors)
    if outputs or errors:
        pipe.hdel(ctx.bkeys.pending(batch_id), *outputs, *errors)
    pipe.execute()
    return len(outputs) + len(errors)


def _ended(custom_id: str, value: str, raw: list[Any]) -> tuple[bool, bytes] | None:
    kind, request_id = value.split(":", 1)
    try:
        result = result_from_hash(request_id, decode_hash(raw, RESULT_FIELDS))
    except NotFound:
        message = f"request {request_id} expired before its result was collected"
        return False, error_line(custom_id, "expired", message, request_id)
    if result is None:
        return None
    return result_line(custom_id, kind, result)  # type: ignore[arg-type]


def cancel_pending(ctx: Context, batch_id: str) -> None:
    """Cancel every line in flight: queued ones go at once, running ones within a step."""
    pending = ctx.redis.hvals(ctx.bkeys.pending(batch_id))
    ids = [text(value).split(":", 1)[1] for value in pending]
    drive(ctx.scripts, ended_flow(ctx.keys, ctx.settings, "cancel", ids))


def _finish_if_done(ctx: Context, batch_id: str, cancelling: bool) -> bool:
    m = store.meta(ctx, batch_id)
    if ctx.redis.hlen(ctx.bkeys.pending(batch_id)):
        return False
    if cancelling:
        _fail_unsent(ctx, batch_id, int(m["cursor"]))
    elif int(m["cursor"]) < int(m["total"]):
        return False
    finish(ctx, batch_id, BatchState.CANCELLED if cancelling else BatchState.COMPLETED)
    return True


def _fail_unsent(ctx: Context, batch_id: str, cursor: int) -> None:
    """An error line for each line from ``cursor`` on that has no result yet."""
    message = "the batch was cancelled before this line was sent"
    for chunk in store.iter_lines(ctx, batch_id, cursor):
        ids = [line.custom_id for line in chunk]
        done = ctx.redis.hmget(ctx.bkeys.outputs(batch_id), ids)
        pipe = ctx.redis.pipeline(transaction=False)
        for custom_id, output in zip(ids, done, strict=True):
            if output is None:
                line = error_line(custom_id, "batch_cancelled", message)
                pipe.hsetnx(ctx.bkeys.errors(batch_id), custom_id, line)
        pipe.execute()


def finish(ctx: Context, batch_id: str, state: BatchState) -> None:
    """Mark the batch ended, send its webhook, and let its keys expire."""
    url, finished_ms = store.meta(ctx, batch_id).get("webhook_url"), store.now_ms(ctx)
    if url:  # before the state changes, so a crash in between sends it on the next try
        done = store.status(ctx, batch_id).model_copy(
            update={"state": state, "finished_ms": finished_ms}
        )
        payload = {"batch": orjson.loads(done.model_dump_json())}
        webhooks.send(ctx, batch_id, url, f"batch.{state.value}", payload)
    pipe = ctx.redis.pipeline(transaction=True)
    pipe.hset(ctx.bkeys.meta(batch_id), mapping={"state": state.value, "finished_ms": finished_ms})
    for key in ctx.bkeys.all_of(batch_id):
        pipe.expire(key, ctx.settings.batch_ttl_s)
    pipe.execute()


def _hset(
    pipe: redis.client.Pipeline, key: str, mapping: dict[str, str] | dict[str, bytes]
) -> None:
    if mapping:
        pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]


def _wait(wakeups: redis.client.PubSub, timeout_s: float) -> None:
    """Until any request changes state (a hint: the next round reads Redis anyway)."""
    wakeups.get_message(timeout=timeout_s)
