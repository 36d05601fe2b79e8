"""Lines in flight and their results: a line's requests (one per choice) are read from
their hashes, and once all have ended the line becomes its output or error line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import redis

from producer.batch.context import Context
from producer.batch.lines import BatchLine, Kind
from producer.batch.output import error_line, result_line
from producer.streams.entries import Entry, readable_entries
from shared.errors import NotFound
from shared.models import Result
from shared.records import RESULT_FIELDS, decode_hash, result_from_hash
from shared.replies import text

PARTLY_SENT = "the batch was cancelled before all of this line's choices were sent"


@dataclass(frozen=True)
class Pending:
    """A line in flight: its kind, the ids of its choices' requests queued so far (fewer
    than ``n`` while the queue was full), and its index in the batch's lines."""

    kind: Kind
    ids: tuple[str, ...]
    at: int | None = None
    n: int = 1

    @property
    def complete(self) -> bool:
        return len(self.ids) == self.n

    def encode(self) -> str:
        return f"{self.kind}:{','.join(self.ids)}:{self.at}:{self.n}"

    @classmethod
    def decode(cls, value: str | bytes) -> Pending:
        name, ids, *rest = text(value).split(":")
        kind = cast(Kind, name)  # written by ``encode`` from a parsed line's kind
        if not rest:  # written before lines had choices: "<kind>:<request id>"
            return cls(kind, (ids,))
        return cls(kind, tuple(ids.split(",")), int(rest[0]), int(rest[1]))


@dataclass
class Choices:
    """What a line's requests have come to: the results of those that ended."""

    results: list[Result] = field(default_factory=list)
    num_running: int = 0
    gone: str | None = None  # a request whose hash expired before it was read


def hset(pipe: redis.client.Pipeline, key: str, mapping: dict[str, str] | dict[str, bytes]) -> None:
    if mapping:
        pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]


def read_pending(ctx: Context, batch_id: str) -> dict[str, Pending]:
    raw = ctx.redis.hgetall(ctx.bkeys.pending(batch_id))
    return {text(k): Pending.decode(v) for k, v in raw.items()}


def collect(ctx: Context, batch_id: str, cancelling: bool = False) -> int:
    """Store the results of lines whose requests have all ended; returns how many. A line
    not yet queued whole (the queue was full) ends early only when the batch is cancelling."""
    pending = read_pending(ctx, batch_id)
    choices = _choices(ctx, pending)
    ended = {c: p for c, p in pending.items() if _has_ended(p, choices[c], cancelling)}
    lines = _lines(ctx, batch_id, ended)
    outputs: dict[str, bytes] = {}
    errors: dict[str, bytes] = {}
    for custom_id, p in ended.items():
        ok, line = _line_result(ctx, lines[custom_id], p, choices[custom_id])
        (outputs if ok else errors)[custom_id] = line
    pipe = ctx.redis.pipeline(transaction=True)
    hset(pipe, ctx.bkeys.outputs(batch_id), outputs)
    hset(pipe, ctx.bkeys.errors(batch_id), errors)
    if ended:
        pipe.hdel(ctx.bkeys.pending(batch_id), *ended)
    pipe.execute()
    return len(ended)


def _choices(ctx: Context, pending: dict[str, Pending]) -> dict[str, Choices]:
    pipe = ctx.main.pipeline(transaction=False)
    for p in pending.values():
        for request_id in p.ids:
            pipe.hmget(ctx.keys.request(request_id), RESULT_FIELDS)
    replies = iter(pipe.execute())
    found: dict[str, Choices] = {}
    for custom_id, p in pending.items():
        choices = found[custom_id] = Choices()
        for request_id in p.ids:
            _add(choices, request_id, next(replies))
    return found


def _add(choices: Choices, request_id: str, raw: list[Any]) -> None:
    try:
        result = result_from_hash(request_id, decode_hash(raw, RESULT_FIELDS))
    except NotFound:
        choices.gone = request_id
        return
    if result is None:
        choices.num_running += 1
    else:
        choices.results.append(result)


def _has_ended(p: Pending, choices: Choices, cancelling: bool) -> bool:
    if choices.gone is not None:
        return True
    return choices.num_running == 0 and (p.complete or cancelling)


def _lines(ctx: Context, batch_id: str, ended: dict[str, Pending]) -> dict[str, BatchLine]:
    """The ended lines as parsed (a line recorded before lines had an index: its kind)."""
    indexed = {c: p.at for c, p in ended.items() if p.at is not None}
    pipe = ctx.redis.pipeline(transaction=False)
    for at in indexed.values():
        pipe.lindex(ctx.bkeys.lines(batch_id), at)
    raws = zip(indexed, pipe.execute(), strict=True)
    found = {c: BatchLine.from_json(raw) for c, raw in raws if raw is not None}
    return {c: found.get(c) or BatchLine(c, p.kind, None) for c, p in ended.items()}


def _line_result(ctx: Context, line: BatchLine, p: Pending, choices: Choices) -> tuple[bool, bytes]:
    if choices.gone is not None:
        message = f"request {choices.gone} expired before its result was collected"
        return False, error_line(line.custom_id, "expired", message, choices.gone)
    if not p.complete:
        return False, error_line(line.custom_id, "batch_cancelled", PARTLY_SENT)
    wants_steps = line.logprobs or line.reasoning is not None  # reasoning tokens are counted
    streams = _streams(ctx, choices.results) if wants_steps else None
    return result_line(line, choices.results, streams)


def _streams(ctx: Context, results: list[Result]) -> list[list[Entry]]:
    """Each request's events, for the logprobs a line asked for and its steps' tokens
    (they are not kept in its result)."""
    pipe = ctx.main.pipeline(transaction=False)
    for result in results:
        pipe.xrange(ctx.keys.stream(result.id))
    replies = pipe.execute()
    return [
        readable_entries(ctx.keys.stream(r.id), entries)
        for r, entries in zip(results, replies, strict=True)
    ]
