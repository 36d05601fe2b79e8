"""Each script call built by a pure function, and its reply parsed by another, so the
sync and asyncio clients, the gateway and the worker share one definition."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot

from shared.fairness import estimated_tokens, fair_member, units
from shared.keys import Keys, model_tag, request_tag, tag_of
from shared.models import GenerationRequest, dumps
from shared.replies import text
from shared.scripts import ScriptCall
from shared.settings import Settings


@dataclass(frozen=True)
class Claimed:
    request_id: str
    lease_token: str
    payload: str
    attempts: int
    num_generated: int


@dataclass(frozen=True)
class Moved:
    """What a one-slot step on a request's slot made of it, for settle.lua."""

    request_id: str
    lease_token: str  # '' for a request no worker held
    state: str
    finished_ms: str = ""
    fenced: bool = False  # fence.lua took it from its lease token in this call
    # Put back having published nothing: it goes among new work, not ahead of it.
    unstarted: bool = False


def admit_call(
    keys: Keys, settings: Settings, request_id: str, req: GenerationRequest, digest: str | None
) -> ScriptCall:
    return ScriptCall(
        "admit",
        [keys.request(request_id), _idempotency_key(keys, request_id, digest)],
        [
            request_id,
            dumps(req).decode(),
            "" if digest is None else "1",
            settings.idempotency_ttl_s,
            req.model,
            int(req.priority),
            "" if req.deadline_ms is None else req.deadline_ms,
            req.tenant or "",
        ],
    )


def enqueue_call(
    keys: Keys, settings: Settings, request_id: str, req: GenerationRequest
) -> ScriptCall:
    tag = model_tag(req.model)
    return ScriptCall(
        "enqueue",
        [
            keys.queue(tag),
            keys.seq(tag),
            keys.wakeup(tag),
            keys.deadlines(tag),
            keys.served(tag),
            keys.owners(tag),
            keys.fair_clock(tag),
            keys.fair_tags(tag),
            keys.loras(tag),
            keys.lora_ranks(tag),
        ],
        [
            request_id,
            int(req.priority),
            settings.max_queued,
            "" if req.deadline_ms is None else req.deadline_ms,
            req.model,
            keys.lifecycle_channel(),
            "1" if settings.require_known_model else "0",
            fair_member(req.priority, req.tenant),
            units(estimated_tokens(req), req.weight),
            req.lora or "",
        ],
    )


def withdraw_call(keys: Keys, request_id: str, digest: str | None) -> ScriptCall:
    idem = _idempotency_key(keys, request_id, digest)
    return ScriptCall("withdraw", [keys.request(request_id), idem], [request_id])


def _idempotency_key(keys: Keys, request_id: str, digest: str | None) -> str:
    """The request's idempotency key; without one, a name on the request's slot that the
    scripts never write (KEYS must name it all the same)."""
    return keys.idempotency(digest) if digest else keys.no_idempotency(request_id)


# Queue entries past its candidates that a claim looks at for requests the worker can
# serve, in place of candidates whose LoRA rank it cannot (claim.lua): bounded, so a
# queue full of adapter requests costs a base-only worker a short look per claim.
CLAIM_LOOK_PAST = 64


def claim_call(
    keys: Keys,
    settings: Settings,
    tag: str,
    worker_id: str,
    ids: list[str],
    max_lora_rank: int | None = None,
) -> ScriptCall:
    """``max_lora_rank``: the largest adapter rank the worker serves (0: none); None
    claims every candidate whatever its adapter."""
    return ScriptCall(
        "claim",
        [
            keys.queue(tag),
            keys.leases(tag),
            keys.owners(tag),
            keys.scores(tag),
            keys.seq(tag),
            keys.fair_clock(tag),
            keys.fair_tags(tag),
            keys.lora_ranks(tag),
        ],
        [
            worker_id,
            settings.lease_ms,
            "" if max_lora_rank is None else max_lora_rank,
            CLAIM_LOOK_PAST,
            *ids,
        ],
    )


def parse_claim(reply: list[Any]) -> list[tuple[str, str]]:
    """(id, lease token) of each leased request."""
    return [(text(reply[i]), text(reply[i + 1])) for i in range(0, len(reply), 2)]


def start_call(
    keys: Keys, settings: Settings, request_id: str, token: str, worker_id: str
) -> ScriptCall:
    return ScriptCall(
        "start",
        [keys.request(request_id), keys.stream(request_id)],
        [request_id, token, worker_id, settings.result_ttl_s, keys.lifecycle_channel()],
    )


def parse_start(reply: list[Any], request_id: str, token: str) -> Claimed | Moved:
    if text(reply[0]) == "started":
        return Claimed(request_id, token, text(reply[1]), int(reply[2]), int(reply[3]))
    return Moved(request_id, token, text(reply[0]), text(reply[1]))


@dataclass(frozen=True)
class TokenPublish:
    """One request's token event within a step."""

    request_id: str
    lease_token: str
    event_json: bytes
    index: int
    num_tokens: int


def publish_calls(keys: Keys, events: list[TokenPublish], cluster: bool) -> list[ScriptCall]:
    """A step's token events: on a cluster one call per run of consecutive events on one
    hash slot (a script's keys share a slot; sort events with ``slot_of`` to make the
    runs long: request tags fall on few slots, see shared/keys.py), or one call for the
    whole step on one Redis (one round of script overhead). The calls' replies, in
    order, give one code per event in the order of ``events``."""
    if not cluster:
        return [_publish_call(keys, events)] if events else []
    runs: list[list[TokenPublish]] = []
    last = -1
    for e in events:
        slot = slot_of(e.request_id)
        if slot != last:
            runs.append([])
            last = slot
        runs[-1].append(e)
    return [_publish_call(keys, run) for run in runs]


def slot_of(request_id: str) -> int:
    """The hash slot of a request's keys (its hash, stream and idempotency key)."""
    return key_slot(request_tag(request_id).encode())


def _publish_call(keys: Keys, events: list[TokenPublish]) -> ScriptCall:
    per_event = [k for e in events for k in (keys.request(e.request_id), keys.stream(e.request_id))]
    args = [
        a for e in events for a in (e.lease_token, e.event_json.decode(), e.num_tokens, e.index)
    ]
    return ScriptCall("publish", per_event, args)


def finish_call(
    keys: Keys,
    settings: Settings,
    request_id: str,
    token: str,
    final_json: bytes,
    output_json: bytes,
    state: str,
) -> ScriptCall:
    return ScriptCall(
        "finish",
        [keys.request(request_id), keys.stream(request_id)],
        [
            request_id,
            token,
            final_json.decode(),
            output_json.decode(),
            state,
            settings.result_ttl_s,
            keys.lifecycle_channel(),
        ],
    )


def parse_finish(reply: Any, request_id: str, token: str) -> Moved | None:
    """What to settle, or None when the lease was lost (nothing written)."""
    if not isinstance(reply, list):
        return None
    return Moved(request_id, token, text(reply[1]), text(reply[2]))


def fence_call(
    keys: Keys, settings: Settings, request_id: str, token: str, mode: str
) -> ScriptCall:
    return ScriptCall(
        "fence",
        [keys.request(request_id), keys.stream(request_id)],
        [
            request_id,
            token,
            mode,
            settings.max_attempts,
            settings.result_ttl_s,
            keys.lifecycle_channel(),
        ],
    )


def request_step_call(keys: Keys, settings: Settings, script: str, request_id: str) -> ScriptCall:
    """cancel.lua or expire.lua: the same KEYS and ARGV."""
    return ScriptCall(
        script,
        [keys.request(request_id), keys.stream(request_id)],
        [request_id, settings.result_ttl_s, keys.lifecycle_channel()],
    )


def parse_moved(reply: list[Any], request_id: str, token: str = "") -> Moved:
    fenced = len(reply) > 2 and text(reply[2]) == "1"
    unstarted = len(reply) > 3 and text(reply[3]) == "1"
    return Moved(request_id, token, text(reply[0]), text(reply[1]), fenced, unstarted)


def settle_call(keys: Keys, tag: str, moved: list[Moved]) -> ScriptCall:
    quints = [
        x
        for m in moved
        for x in (m.request_id, m.lease_token, m.state, m.finished_ms, "1" if m.unstarted else "")
    ]
    return ScriptCall(
        "settle",
        [
            keys.leases(tag),
            keys.owners(tag),
            keys.scores(tag),
            keys.queue(tag),
            keys.wakeup(tag),
            keys.deadlines(tag),
            keys.dead(tag),
            keys.recent(tag),
            keys.failed(tag),
            keys.lora_ranks(tag),
        ],
        [keys.lifecycle_channel(), *quints],
    )


def renew_call(keys: Keys, settings: Settings, tag: str, held: dict[str, str]) -> ScriptCall:
    pairs = [x for item in held.items() for x in item]
    return ScriptCall("renew", [keys.leases(tag), keys.owners(tag)], [settings.lease_ms, *pairs])


def reset_call(keys: Keys, request_id: str) -> ScriptCall:
    return ScriptCall("reset", [keys.request(request_id), keys.stream(request_id)], [])


def retry_call(keys: Keys, request_id: str, priority: str) -> ScriptCall:
    tag = tag_of(request_id)
    return ScriptCall(
        "retry",
        [keys.dead(tag), keys.queue(tag), keys.seq(tag), keys.wakeup(tag)],
        [request_id, priority, keys.lifecycle_channel()],
    )


def charge_call(keys: Keys, tag: str, charges: list[tuple[int, str | None, int]]) -> ScriptCall:
    """(priority, tenant, units) each: service beyond the enqueue estimate (charge.lua)."""
    args = [a for p, tenant, n in charges for a in (p, fair_member(p, tenant), n)]
    return ScriptCall("charge", [keys.fair_clock(tag), keys.fair_tags(tag)], args)
