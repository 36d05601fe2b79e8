"""Operations that span a request's slot and its model's, as sans-IO generators.

A flow yields the commands of one round trip (script calls, or plain commands as
tuples) and is sent back their replies; ``drive`` and ``drive_async`` are the two
transports. The order of the steps is what keeps a crash between them harmless:
see the header of ``shared/lua/_lib.lua``. Each script's call and reply are typed in
``shared.ops``.

A step that decides a request's fate (it is accepted, runs, ends, is cancelled or
reclaimed) is ``Replicated``: with TOKENQ_REDIS_MIN_REPLICAS it returns only once that
many replicas have its writes and every write of the flow before it. Short of them in
time, the transport throws ReplicationTimeout into the flow, which takes back what it
can (a submit withdraws its requests, a claim hands its requests back) and raises it.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.errors import (
    IdempotencyKeyReused,
    MissingCapability,
    ModelUnavailable,
    NotFound,
    QueueFull,
    ReplicationTimeout,
    TokenqError,
    UnknownAdapter,
    UnknownModel,
)
from shared.keys import Keys, idempotency_digest, idempotency_tag, new_request_id, tag_of
from shared.models import GenerationRequest
from shared.ops.admin import reset_call, retry_call
from shared.ops.claim import Claim, Claimed, Start
from shared.ops.moves import End, EndOutcome, EndScript, Fate, Fence, FenceMode, Moved, Settle
from shared.ops.publish import Finish
from shared.ops.submit import Admit, AdmitOutcome, Enqueue, EnqueueOutcome, Queued, Withdraw
from shared.replication import Confirm, first_keys
from shared.replies import text
from shared.scripts import AsyncScripts, ScriptCall, Scripts
from shared.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")
Command = ScriptCall | tuple[Any, ...]


@dataclass(frozen=True)
class Replicated:
    """A step whose writes, with those of its flow before it, decide a request's fate."""

    commands: Sequence[Command]
    what: str  # for the error when replicas fall short: "a submit", "a claim", ...


Step = Sequence[Command] | Replicated
Flow = Generator[Step, list[Any], T]


class _Steps:
    """What ``drive`` tracks of a flow: the keys written since the last confirmed step."""

    def __init__(self) -> None:
        self.touched: list[str] = []

    def unpack(self, step: Step) -> tuple[Sequence[Command], Confirm | None]:
        commands = step.commands if isinstance(step, Replicated) else step
        self.touched += first_keys(commands)
        if not isinstance(step, Replicated):
            return commands, None
        confirm, self.touched = Confirm(self.touched, step.what), []
        return commands, confirm


def drive(scripts: Scripts, flow: Flow[T]) -> T:
    """Run ``flow`` on the connection ``scripts`` is registered on, one round trip per step."""
    steps = _Steps()
    try:
        step = next(flow)
        while True:
            commands, confirm = steps.unpack(step)
            try:
                replies = scripts.send(commands, confirm)
            except ReplicationTimeout as e:
                step = flow.throw(e)  # the flow takes back what it can, and raises
                continue
            step = flow.send(replies)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def drive_async(scripts: AsyncScripts, flow: Flow[T]) -> T:
    """The asyncio twin of ``drive``."""
    steps = _Steps()
    try:
        step = next(flow)
        while True:
            commands, confirm = steps.unpack(step)
            try:
                replies = await scripts.send(commands, confirm)
            except ReplicationTimeout as e:
                step = flow.throw(e)
                continue
            step = flow.send(replies)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Enqueued:
    request_id: str
    duplicate: bool
    # Not queued (and withdrawn); or KEY_REUSED: its idempotency key names ``request_id``,
    # a request with another body, and nothing was done.
    refused: EnqueueOutcome | AdmitOutcome | None = None
    reason: str = ""  # with UNLOADABLE: why the model's last worker could not load it


def enqueue_flow(
    keys: Keys, settings: Settings, reqs: list[GenerationRequest]
) -> Flow[list[Enqueued]]:
    """Admit each request on its own slot, then queue it on its model's; a refused one is
    withdrawn. A duplicate idempotency key answers the original id, and queues it should
    an earlier submit have died between the two steps (enqueue.lua is idempotent); one
    sent with another body than the original's is refused (KEY_REUSED)."""
    digests = [_digest(r) for r in reqs]
    keyed = [n for n, d in enumerate(digests) if d]
    # Keys written before request tags were bounded (shared/keys.py) sit on another slot:
    # looked up first, so a retry across that upgrade still finds its request. Their
    # bodies were not kept: any body matches.
    found = yield [("GET", keys.legacy_idempotency(digests[n] or "")) for n in keyed]
    legacy = {n: text(v) for n, v in zip(keyed, found, strict=True) if v}
    new = [n for n in range(len(reqs)) if n not in legacy]
    admits = [Admit(_new_id(reqs[n], digests[n]), reqs[n], digests[n]) for n in new]
    replies = yield [a.call(keys, settings) for a in admits]
    admitted = {n: Admit.parse(r) for n, r in zip(new, replies, strict=True)}
    ids = [legacy[n] if n in legacy else admitted[n].request_id for n in range(len(reqs))]
    outcomes = [
        admitted[n].outcome if n in admitted else AdmitOutcome.DUPLICATE for n in range(len(reqs))
    ]
    fresh = [o is AdmitOutcome.OK for o in outcomes]
    dups = [n for n, o in enumerate(outcomes) if o is AdmitOutcome.DUPLICATE]
    states = yield [("HGET", keys.request(ids[n]), "state") for n in dups]
    requeue = {n for n, state in zip(dups, states, strict=True) if text(state or b"") == "queued"}
    picked = [n for n in range(len(reqs)) if fresh[n] or n in requeue]
    calls = [Enqueue(ids[n], reqs[n]).call(keys, settings) for n in picked]
    try:
        replies = yield Replicated(calls, f"the submit of {len(reqs)} request(s)")
    except ReplicationTimeout:
        yield from _withdraw([(ids[n], digests[n]) for n in picked if fresh[n]], keys)
        raise
    queued = {n: Enqueue.parse(r) for n, r in zip(picked, replies, strict=True)}
    refused = [n for n in picked if queued[n].outcome is not EnqueueOutcome.OK]
    yield [Withdraw(ids[n], digests[n]).call(keys) for n in refused if fresh[n]]
    return [
        _enqueued(i, o, queued.get(n)) for n, (i, o) in enumerate(zip(ids, outcomes, strict=True))
    ]


def _enqueued(request_id: str, admitted: AdmitOutcome, queued: Queued | None) -> Enqueued:
    duplicate = admitted is not AdmitOutcome.OK
    if admitted is AdmitOutcome.KEY_REUSED:
        return Enqueued(request_id, duplicate, admitted)
    if queued is not None and queued.outcome is not EnqueueOutcome.OK:
        return Enqueued(request_id, duplicate, queued.outcome, queued.reason)
    return Enqueued(request_id, duplicate)


def _withdraw(admitted: list[tuple[str, str | None]], keys: Keys) -> Flow[None]:
    """Take back requests whose submit failed: their hashes (those no worker has taken
    yet), then their queue entries."""
    withdraws = [Withdraw(i, digest) for i, digest in admitted]
    replies = yield [w.call(keys) for w in withdraws]
    gone = [w.request_id for w, r in zip(withdraws, replies, strict=True) if Withdraw.parse(r)]
    by_tag: dict[str, list[Moved]] = {}
    for i in gone:
        by_tag.setdefault(tag_of(i), []).append(Moved(i, "", Fate.MISSING))
    yield [Settle(tag, moved).call(keys) for tag, moved in by_tag.items()]


def accepted(
    enqueued: list[Enqueued], reqs: list[GenerationRequest], settings: Settings
) -> list[str]:
    """The ids, or QueueFull / UnknownModel / UnknownAdapter / IdempotencyKeyReused for
    the first refused request (those before it stay accepted)."""
    for e, req in zip(enqueued, reqs, strict=True):
        if e.refused is not None:
            raise refusal(e, req, settings)
    return [e.request_id for e in enqueued]


def refusal(e: Enqueued, req: GenerationRequest, settings: Settings) -> TokenqError:
    """The error that says why admit.lua or enqueue.lua refused ``req``."""
    if e.refused is AdmitOutcome.KEY_REUSED:
        return IdempotencyKeyReused(req.idempotency_key or "", e.request_id)
    if e.refused is EnqueueOutcome.FULL:
        return QueueFull(req.model, settings.max_queued)
    if e.refused is EnqueueOutcome.UNKNOWN_LORA:
        return UnknownAdapter(req.model, req.lora or "")
    if e.refused is EnqueueOutcome.UNLOADABLE:
        return ModelUnavailable(req.model, e.reason)
    if e.refused is EnqueueOutcome.NO_CAPABILITY:
        return MissingCapability(req.model, e.reason)
    return UnknownModel(req.model)


def _new_id(req: GenerationRequest, digest: str | None) -> str:
    return new_request_id(req.model, idempotency_tag(digest) if digest else None)


def _digest(req: GenerationRequest) -> str | None:
    if not req.idempotency_key:
        return None
    return idempotency_digest(req.model, req.idempotency_key, req.tenant)


def claim_flow(
    keys: Keys, settings: Settings, claim: Claim, cluster: bool = False
) -> Flow[list[Claimed]]:
    """Lease the queue's heads on the model's slot, start each on its own slot (one call,
    or one per slot on a cluster), and drop the leases of those that may not start
    (taken, cancelled, expired, gone). A head whose adapter's rank is over the worker's
    stays queued, and one further on that the worker can serve is leased in its place
    (claim.lua). Queue entries that are not request ids are taken off the queue."""
    (reply,) = yield [claim.call(keys)]
    claimed = Claim.parse(reply)
    if claimed.malformed:
        log.error("removed malformed queue entries %r", claimed.malformed)
    start = Start(claimed.leased, claim.worker_id)
    try:
        replies = yield Replicated(start.calls(keys, settings.result_ttl_s, cluster), "a claim")
    except ReplicationTimeout:
        held = {x.request_id: x.lease_token for x in claimed.leased}
        yield from fence_flow(keys, settings, claim.tag, held, FenceMode.RELEASE, confirm=False)
        raise
    outcomes = start.parse(replies, cluster)
    moved = [o for o in outcomes if isinstance(o, Moved)]
    yield [Settle(claim.tag, moved).call(keys)] if moved else []
    return [o for o in outcomes if isinstance(o, Claimed)]


def fence_flow(
    keys: Keys,
    settings: Settings,
    tag: str,
    held: Mapping[str, str],
    mode: FenceMode,
    confirm: bool = True,
) -> Flow[list[Moved]]:
    """Take requests from their lease tokens (reap or release), then move them on the
    model's slot: back to the queue, or filed as ended. (``confirm``: wait for replicas.)"""
    fences = [Fence(i, token, mode) for i, token in held.items()]
    ttl_s, attempts = settings.result_ttl_s, settings.max_attempts
    calls = [f.call(keys, attempts, ttl_s) for f in fences]
    replies = yield Replicated(calls, f"a {mode.value}") if confirm and calls else calls
    moved = [f.parse(r) for f, r in zip(fences, replies, strict=True)]
    yield [Settle(tag, moved).call(keys)] if moved else []
    return moved


def ended_flow(
    keys: Keys, settings: Settings, script: EndScript, request_ids: Iterable[str]
) -> Flow[list[EndOutcome]]:
    """cancel.lua or expire.lua on each request's slot, then settle what ended."""
    ends = [End(script, i) for i in request_ids]
    calls = [e.call(keys, settings.result_ttl_s) for e in ends]
    what = "a cancel" if script is EndScript.CANCEL else "an expiry"
    replies = yield Replicated(calls, what) if calls else calls
    ended = [e.parse(r) for e, r in zip(ends, replies, strict=True)]
    by_tag: dict[str, list[Moved]] = {}
    for m in (x.moved for x in ended if x.moved is not None):
        by_tag.setdefault(tag_of(m.request_id), []).append(m)
    yield [Settle(tag, items).call(keys) for tag, items in by_tag.items()]
    return [x.outcome for x in ended]


def cancel_flow(keys: Keys, settings: Settings, request_id: str) -> Flow[EndOutcome]:
    """CANCELLED (was queued), REQUESTED (running), DONE; NotFound if missing."""
    (outcome,) = yield from ended_flow(keys, settings, EndScript.CANCEL, [request_id])
    if outcome is EndOutcome.MISSING:
        raise NotFound(f"request {request_id} does not exist (or has expired)")
    return outcome


def retry_flow(keys: Keys, request_id: str) -> Flow[bool]:
    """Run a dead-lettered request again from the start; False if it is not dead."""
    (priority,) = yield [reset_call(keys, request_id)]
    if not text(priority):
        return False
    (queued,) = yield Replicated([retry_call(keys, request_id, text(priority))], "a retry")
    return bool(queued)


def finish_flow(keys: Keys, settings: Settings, finish: Finish) -> Flow[str | None]:
    """One final alone (publish.lua), then its settle: the final event's json, or None
    when nothing was written (the lease lost)."""
    (reply,) = yield Replicated([finish.call(keys, settings.result_ttl_s)], "a final")
    finished = finish.parse(reply)
    if finished is None:
        return None
    yield [Settle(tag_of(finish.request_id), [finished.moved]).call(keys)]
    return finished.final_json
