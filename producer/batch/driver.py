"""One tick of a batch: fan lines into tokenq's queue, collect what ended, finish.

Every step is safe to repeat after a crash: a line's request carries the
idempotency key ``<batch id>:<custom_id>``, so enqueueing it again returns the
request it already has instead of running it twice, and results are stored by
custom_id.
"""

from __future__ import annotations

import time

import orjson
import redis

from producer.batch import result_files, store, webhooks
from producer.batch.collect import Pending, collect, hset, read_pending
from producer.batch.context import Context
from producer.batch.lines import BatchLine
from producer.batch.models import BatchState
from producer.batch.output import error_line, refused_line
from producer.requests import choice_requests
from producer.submit import Submitter, as_submitted
from shared.errors import MissingCapability
from shared.flows import Enqueued, drive, ended_flow, enqueue_flow, refusal
from shared.models import GenerationRequest
from shared.ops.moves import EndScript
from shared.ops.submit import EnqueueOutcome
from shared.refusal import RequestRefused

FAN_OUT_CHUNK = 100
# The error line of a line a batch never sent, by how the batch ended.
UNSENT = {
    BatchState.CANCELLED: ("batch_cancelled", "the batch was cancelled before this line was sent"),
    BatchState.EXPIRED: (
        "batch_expired",
        "this line could not be run before the batch's completion window ended",
    ),
}


def run_tick(ctx: Context, batch_id: str, job_id: str) -> bool:
    """Drive the batch for about ``batch_tick_s``; True once it has ended (or this job
    is no longer its driver), False when the next job should carry on."""
    give_up = time.monotonic() + ctx.settings.batch_tick_s
    with ctx.main.pubsub(ignore_subscribe_messages=True) as wakeups:  # type: ignore[no-untyped-call]
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
    ending = _ending(ctx, batch_id, m)
    if ending is not None:
        cancel_pending(ctx, batch_id)
    else:
        fan_out(ctx, batch_id, m)
    collect(ctx, batch_id, ending is not None)
    return _finish_if_done(ctx, batch_id, ending)


def _ending(ctx: Context, batch_id: str, m: dict[str, str]) -> BatchState | None:
    """CANCELLED for a batch being cancelled, EXPIRED for one past its completion
    window; None while it runs on."""
    if BatchState(m["state"]) is BatchState.CANCELLING:
        # A cancel from the dashboard marks the state alone: the time is noted here.
        ctx.redis.hsetnx(ctx.bkeys.meta(batch_id), "cancelling_ms", store.now_ms(ctx))
        return BatchState.CANCELLED
    if m.get("expires_ms") and store.now_ms(ctx) > int(m["expires_ms"]):
        return BatchState.EXPIRED
    return None


def fan_out(ctx: Context, batch_id: str, m: dict[str, str]) -> int:
    """Enqueue the next lines that fit (a line's n choices as n requests); returns how
    many lines were taken."""
    cursor, total = int(m["cursor"]), int(m["total"])
    room = ctx.settings.batch_max_in_flight - _num_in_flight(ctx, batch_id)
    if room <= 0 or cursor >= total:
        return 0
    lines = store.read_lines(ctx, batch_id, cursor, min(room, FAN_OUT_CHUNK))
    tenant = m.get("tenant") or None
    over = _over_limits(ctx, lines)
    requests = [
        r
        for line in lines
        if line.request is not None and line.custom_id not in over
        for r in _requests(batch_id, int(m["priority"]), tenant, line, line.request)
    ]
    enqueued = (
        drive(ctx.scripts, enqueue_flow(ctx.keys, ctx.settings, requests)) if requests else []
    )
    return _record_fan_out(ctx, batch_id, cursor, lines, enqueued, over)


def _over_limits(ctx: Context, lines: list[BatchLine]) -> dict[str, bytes]:
    """The error line of each line its model's registered limits refuse (the check
    every submit path runs), by custom_id: it is never queued."""
    over: dict[str, bytes] = {}
    for line in lines:
        if line.request is None:
            continue
        try:
            ctx.limits.check([line.request])
        except RequestRefused as e:
            over[line.custom_id] = error_line(line.custom_id, e.refusal.code.value, str(e))
        except MissingCapability:
            continue  # the enqueue refuses it, naming what no worker serves
    return over


def _num_in_flight(ctx: Context, batch_id: str) -> int:
    """Lines queued whole; one the queue was too full for is sent again from the cursor."""
    return sum(p.complete for p in read_pending(ctx, batch_id).values())


def _requests(
    batch_id: str, priority: int, tenant: str | None, line: BatchLine, request: GenerationRequest
) -> list[GenerationRequest]:
    metadata = {**request.metadata, "batch_id": batch_id, "custom_id": line.custom_id}
    request = as_submitted(request, Submitter(tenant))  # the batch's tenant, as it was submitted
    update = {
        "priority": priority,
        "idempotency_key": f"{batch_id}:{line.custom_id}",
        "metadata": metadata,
    }
    return choice_requests(request.model_copy(update=update), line.n)


def _record_fan_out(
    ctx: Context,
    batch_id: str,
    cursor: int,
    lines: list[BatchLine],
    enqueued: list[Enqueued],
    over: dict[str, bytes],
) -> int:
    """Record what was enqueued; the cursor stops at the first line that did not fit.
    Lines after it that did fit (a worker made room meanwhile), and the choices of a line
    that partly fit, are recorded too, so a cancel finds them; the next round enqueues
    them again and gets the same requests."""
    pending: dict[str, str] = {}
    failed: dict[str, bytes] = dict(over)  # refused before they were queued
    taken = len(lines)
    replies = iter(enqueued)
    for i, line in enumerate(lines):
        if line.request is None:
            failed[line.custom_id] = refused_line(line)
            continue
        if line.custom_id in over:
            continue
        choices = [next(replies) for _ in range(line.n)]
        if any(e.refused is EnqueueOutcome.FULL for e in choices):
            taken = min(taken, i)  # back off: the next round starts from this line
        elif refused := [e for e in choices if e.refused is not None]:
            message = str(refusal(refused[0], line.request, ctx.settings))
            failed[line.custom_id] = error_line(line.custom_id, str(refused[0].refused), message)
            continue
        ids = tuple(e.request_id for e in choices if e.refused is None)
        if ids:
            pending[line.custom_id] = Pending(line.kind, ids, cursor + i, line.n).encode()
    pipe = ctx.redis.pipeline(transaction=True)
    hset(pipe, ctx.bkeys.pending(batch_id), pending)
    hset(pipe, ctx.bkeys.errors(batch_id), failed)
    pipe.hset(ctx.bkeys.meta(batch_id), "cursor", cursor + taken)
    pipe.execute()
    return taken


def cancel_pending(ctx: Context, batch_id: str) -> None:
    """Cancel every line in flight, each of its choices: queued ones go at once, running
    ones within a step."""
    ids = [i for p in read_pending(ctx, batch_id).values() for i in p.ids]
    drive(ctx.scripts, ended_flow(ctx.keys, ctx.settings, EndScript.CANCEL, ids))


def _finish_if_done(ctx: Context, batch_id: str, ending: BatchState | None) -> bool:
    m = store.meta(ctx, batch_id)
    if ctx.redis.hlen(ctx.bkeys.pending(batch_id)):
        return False
    if ending is not None:
        _fail_unsent(ctx, batch_id, int(m["cursor"]), UNSENT[ending])
    elif int(m["cursor"]) < int(m["total"]):
        return False
    else:
        finalizing = {"state": BatchState.FINALIZING.value, "finalizing_ms": store.now_ms(ctx)}
        ctx.redis.hset(ctx.bkeys.meta(batch_id), mapping=finalizing)  # type: ignore[arg-type]
    finish(ctx, batch_id, ending or BatchState.COMPLETED)
    return True


def _fail_unsent(ctx: Context, batch_id: str, cursor: int, why: tuple[str, str]) -> None:
    """An error line (``why``: its code and message) for each line from ``cursor`` on
    that has no result yet."""
    code, message = why
    for chunk in store.iter_lines(ctx, batch_id, cursor):
        ids = [line.custom_id for line in chunk]
        done = ctx.redis.hmget(ctx.bkeys.outputs(batch_id), ids)
        pipe = ctx.redis.pipeline(transaction=False)
        for custom_id, output in zip(ids, done, strict=True):
            if output is None:
                pipe.hsetnx(
                    ctx.bkeys.errors(batch_id), custom_id, error_line(custom_id, code, message)
                )
        pipe.execute()


def finish(ctx: Context, batch_id: str, state: BatchState) -> None:
    """Mark the batch ended with its output and error files, send its webhook, and let
    its keys expire."""
    url, finished_ms = store.meta(ctx, batch_id).get("webhook_url"), store.now_ms(ctx)
    if url:  # before the state changes, so a crash in between sends it on the next try
        done = store.status(ctx, batch_id).model_copy(
            update={"state": state, "finished_ms": finished_ms}
        )
        payload = {"batch": orjson.loads(done.model_dump_json())}
        webhooks.send(ctx, batch_id, url, f"batch.{state.value}", payload)
    ended = {"state": state.value, "finished_ms": finished_ms}
    ended |= result_files.record(ctx, batch_id)  # before the state: a retry makes them again
    pipe = ctx.redis.pipeline(transaction=True)
    pipe.hset(ctx.bkeys.meta(batch_id), mapping=ended)  # type: ignore[arg-type]
    for key in ctx.bkeys.all_of(batch_id):
        pipe.expire(key, ctx.settings.batch_ttl_s)
    pipe.execute()


def _wait(wakeups: redis.client.PubSub, timeout_s: float) -> None:
    """Until any request changes state (a hint: the next round reads Redis anyway)."""
    wakeups.get_message(timeout=timeout_s)
