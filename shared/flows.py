"""Operations that span a request's slot and its model's, as sans-IO generators.

A flow yields the commands of one round trip (script calls, or plain commands as
tuples) and is sent back their replies; ``drive`` and ``drive_async`` are the two
transports. The order of the steps is what keeps a crash between them harmless:
see the header of ``shared/lua/_lib.lua``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.calls import (
    Claimed,
    Moved,
    admit_call,
    claim_call,
    enqueue_call,
    fence_call,
    parse_claim,
    parse_finish,
    parse_moved,
    parse_start,
    request_step_call,
    reset_call,
    retry_call,
    settle_call,
    start_call,
    withdraw_call,
)
from shared.errors import NotFound, QueueFull, TokenqError, UnknownAdapter, UnknownModel
from shared.keys import Keys, idempotency_digest, idempotency_tag, new_request_id, tag_of
from shared.models import GenerationRequest
from shared.replies import text
from shared.scripts import AsyncScripts, ScriptCall, Scripts
from shared.settings import Settings

T = TypeVar("T")
Command = ScriptCall | tuple[Any, ...]
Flow = Generator[Sequence[Command], list[Any], T]


def drive(scripts: Scripts, flow: Flow[T]) -> T:
    """Run ``flow`` on the connection ``scripts`` is registered on, one round trip per step."""
    try:
        commands = next(flow)
        while True:
            commands = flow.send(scripts.send(commands))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def drive_async(scripts: AsyncScripts, flow: Flow[T]) -> T:
    """The asyncio twin of ``drive``."""
    try:
        commands = next(flow)
        while True:
            commands = flow.send(await scripts.send(commands))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Enqueued:
    request_id: str
    duplicate: bool
    refused: str = ""  # 'full', 'unknown_model' or 'unknown_lora': not queued (and withdrawn)


def enqueue_flow(
    keys: Keys, settings: Settings, reqs: list[GenerationRequest]
) -> Flow[list[Enqueued]]:
    """Admit each request on its own slot, then queue it on its model's; a refused one is
    withdrawn. A duplicate idempotency key answers the original id, and queues it should
    an earlier submit have died between the two steps (enqueue.lua is idempotent)."""
    digests = [_digest(r) for r in reqs]
    keyed = [n for n, d in enumerate(digests) if d]
    # Keys written before request tags were bounded (shared/keys.py) sit on another slot:
    # looked up first, so a retry across that upgrade still finds its request.
    found = yield [("GET", keys.legacy_idempotency(digests[n] or "")) for n in keyed]
    legacy = {n: text(v) for n, v in zip(keyed, found, strict=True) if v}
    new = [n for n in range(len(reqs)) if n not in legacy]
    calls = [
        admit_call(keys, settings, _new_id(reqs[n], digests[n]), reqs[n], digests[n]) for n in new
    ]
    admitted = dict(zip(new, (yield calls), strict=True))
    ids = [legacy[n] if n in legacy else text(admitted[n][1]) for n in range(len(reqs))]
    fresh = [n in admitted and text(admitted[n][0]) == "ok" for n in range(len(reqs))]
    dup_ids = [i for i, f in zip(ids, fresh, strict=True) if not f]
    states = iter((yield [("HGET", keys.request(i), "state") for i in dup_ids]))
    todo = [f or text(next(states) or b"") == "queued" for f in fresh]
    picked = [n for n, t in enumerate(todo) if t]
    replies = yield [enqueue_call(keys, settings, ids[n], reqs[n]) for n in picked]
    status = {n: text(r[0]) for n, r in zip(picked, replies, strict=True)}
    refused = [n for n in picked if status[n] != "ok"]
    yield [withdraw_call(keys, ids[n], digests[n]) for n in refused if fresh[n]]
    return [
        Enqueued(i, not f, "" if status.get(n, "ok") == "ok" else status[n])
        for n, (i, f) in enumerate(zip(ids, fresh, strict=True))
    ]


def accepted(
    enqueued: list[Enqueued], reqs: list[GenerationRequest], settings: Settings
) -> list[str]:
    """The ids, or QueueFull / UnknownModel / UnknownAdapter for the first refused
    request (those before it stay accepted)."""
    for e, req in zip(enqueued, reqs, strict=True):
        if e.refused:
            raise refusal(e, req, settings)
    return [e.request_id for e in enqueued]


def refusal(e: Enqueued, req: GenerationRequest, settings: Settings) -> TokenqError:
    """The error that says why enqueue.lua refused ``req``."""
    if e.refused == "full":
        return QueueFull(req.model, settings.max_queued)
    if e.refused == "unknown_lora":
        return UnknownAdapter(req.model, req.lora or "")
    return UnknownModel(req.model)


def _new_id(req: GenerationRequest, digest: str | None) -> str:
    return new_request_id(req.model, idempotency_tag(digest) if digest else None)


def _of(indices: list[int], items: list[T]) -> list[tuple[int, T]]:
    return [(n, items[n]) for n in indices]


def _digest(req: GenerationRequest) -> str | None:
    if not req.idempotency_key:
        return None
    return idempotency_digest(req.model, req.idempotency_key, req.tenant)


def claim_flow(
    keys: Keys,
    settings: Settings,
    tag: str,
    worker_id: str,
    ids: list[str],
    max_lora_rank: int | None = None,
) -> Flow[list[Claimed]]:
    """Lease candidates on the model's slot, start each on its own slot, and drop the
    leases of those that may not start (taken, cancelled, expired, gone). With
    ``max_lora_rank`` (0: the worker serves no adapters) a candidate whose adapter's rank
    is over it stays queued, and one further on that the worker can serve is leased in
    its place (``shared.calls.claim_call``)."""
    call = claim_call(keys, settings, tag, worker_id, ids, max_lora_rank)
    (reply,) = yield [call]
    leased = parse_claim(reply)
    started = yield [start_call(keys, settings, i, token, worker_id) for i, token in leased]
    outcomes = [parse_start(r, i, token) for r, (i, token) in zip(started, leased, strict=True)]
    moved = [o for o in outcomes if isinstance(o, Moved)]
    yield [settle_call(keys, tag, moved)] if moved else []
    return [o for o in outcomes if isinstance(o, Claimed)]


def fence_flow(
    keys: Keys, settings: Settings, tag: str, held: dict[str, str], mode: str
) -> Flow[list[Moved]]:
    """Take requests from their lease tokens (reap or release), then move them on the
    model's slot: back to the queue, or filed as ended."""
    replies = yield [fence_call(keys, settings, i, token, mode) for i, token in held.items()]
    moved = [parse_moved(r, i, t) for r, (i, t) in zip(replies, held.items(), strict=True)]
    yield [settle_call(keys, tag, moved)] if moved else []
    return moved


def ended_flow(
    keys: Keys, settings: Settings, script: str, request_ids: Iterable[str]
) -> Flow[list[Moved]]:
    """cancel.lua or expire.lua on each request's slot, then settle what ended."""
    ids = list(request_ids)
    replies = yield [request_step_call(keys, settings, script, i) for i in ids]
    moved = [parse_moved(r, i) for r, i in zip(replies, ids, strict=True)]
    ended = [m for m in moved if m.state in ("cancelled", "expired")]
    by_tag: dict[str, list[Moved]] = {}
    for m in ended:
        by_tag.setdefault(tag_of(m.request_id), []).append(m)
    yield [settle_call(keys, tag, items) for tag, items in by_tag.items()]
    return moved


def cancel_flow(keys: Keys, settings: Settings, request_id: str) -> Flow[str]:
    """'cancelled' (was queued), 'requested' (running), 'done'; NotFound if missing."""
    (moved,) = yield from ended_flow(keys, settings, "cancel", [request_id])
    if moved.state == "missing":
        raise NotFound(f"request {request_id} does not exist (or has expired)")
    return moved.state


def retry_flow(keys: Keys, request_id: str) -> Flow[bool]:
    """Run a dead-lettered request again from the start; False if it is not dead."""
    (priority,) = yield [reset_call(keys, request_id)]
    if not text(priority):
        return False
    (queued,) = yield [retry_call(keys, request_id, text(priority))]
    return bool(queued)


def finish_flow(keys: Keys, finish: ScriptCall) -> Flow[Any]:
    """One finish.lua call (``shared.calls.finish_call``), then its settle: the final
    event's json, or 0 when the lease was lost (nothing written)."""
    request_id, token = str(finish.args[0]), str(finish.args[1])
    (reply,) = yield [finish]
    moved = parse_finish(reply, request_id, token)
    if moved is None:
        return 0
    yield [settle_call(keys, tag_of(request_id), [moved])]
    return reply[0]
