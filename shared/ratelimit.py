"""Rate limits per API key: requests and tokens per minute, concurrent requests.

Enforced in Redis by ratelimit.lua on the key's own slot (``Keys.rate_limit``), so
every gateway and every Python client carrying that key shares one budget. A request
is charged its prompt (estimated from its length) plus ``max_tokens``, when it is
submitted, as OpenAI counts it: what it will generate is not known yet, and a limit
that charged it later could not refuse the burst that overruns it. A request the
limits admit but the queue then refuses (full) keeps its charge: a client retrying a
full queue in a loop is held to its rate like any other.

A concurrent place is held from submit until the request ends. The place is taken
under a placeholder before the request has an id and moved to the id once it is
queued; places of requests that have ended are dropped when the limit is reached,
and any place lapses after ``Settings.rate_limit_inflight_s``.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.errors import RateLimited
from shared.fairness import estimated_prompt_tokens
from shared.flows import Enqueued, Flow, enqueue_flow
from shared.keys import REQUEST_ID_RE, Keys
from shared.models import GenerationRequest, RequestState
from shared.replies import text
from shared.scripts import ScriptCall
from shared.settings import Settings

PLACEHOLDER = "held:"


@dataclass(frozen=True)
class Limits:
    """Per minute and at once; None is no limit."""

    requests_per_min: int | None = None
    tokens_per_min: int | None = None
    max_concurrent: int | None = None

    @property
    def any(self) -> bool:
        values = (self.requests_per_min, self.tokens_per_min, self.max_concurrent)
        return any(v is not None for v in values)


@dataclass(frozen=True)
class Verdict:
    """ratelimit.lua's answer; the figures are OpenAI's x-ratelimit-* headers."""

    verdict: str
    retry_after_ms: int
    limit_requests: int
    remaining_requests: int
    reset_requests_ms: int
    limit_tokens: int
    remaining_tokens: int
    reset_tokens_ms: int
    in_flight: int

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


def request_tokens(req: GenerationRequest) -> int:
    """What a request counts against tokens per minute."""
    output = 0 if req.task == "embed" else req.sampling.max_tokens
    return estimated_prompt_tokens(req) + output


def limit_call(
    keys: Keys, settings: Settings, bucket: str, limits: Limits, num_tokens: int, member: str
) -> ScriptCall:
    return ScriptCall(
        "ratelimit",
        [_key(keys, bucket, name) for name in ("requests", "tokens", "inflight")],
        [
            limits.requests_per_min or 0,
            limits.tokens_per_min or 0,
            limits.max_concurrent or 0,
            num_tokens,
            member,
            settings.rate_limit_inflight_s * 1000,
        ],
    )


def _key(keys: Keys, bucket: str, name: str) -> str:
    return keys.rate_limit(bucket, name)


def bucket_of(identity: str) -> str:
    """A bucket name for an API key (or a client's tenant) that reveals nothing of it."""
    return hashlib.sha256(("tokenq-rate-limit\x00" + identity).encode()).hexdigest()[:16]


def parse_verdict(reply: list[Any]) -> Verdict:
    return Verdict(text(reply[0]), *(int(x) for x in reply[1:9]))


def admit_flow(
    keys: Keys, settings: Settings, bucket: str, limits: Limits, req: GenerationRequest
) -> Flow[tuple[Verdict, str]]:
    """Take one request's place under the limits: (verdict, placeholder member). When only
    the concurrency limit refuses, places of requests that ended are dropped and it is
    asked once more."""
    member = PLACEHOLDER + secrets.token_hex(8)
    call = limit_call(keys, settings, bucket, limits, request_tokens(req), member)
    (reply,) = yield [call]
    verdict = parse_verdict(reply)
    if verdict.verdict == "concurrent":
        yield from _drop_ended(keys, bucket)
        (reply,) = yield [call]
        verdict = parse_verdict(reply)
    return verdict, member


def _drop_ended(keys: Keys, bucket: str) -> Flow[None]:
    inflight = _key(keys, bucket, "inflight")
    (members,) = yield [("ZRANGE", inflight, 0, -1)]
    ids = [m for m in (text(x) for x in members) if REQUEST_ID_RE.match(m)]
    states = yield [("HGET", keys.request(i), "state") for i in ids]
    ended = [i for i, s in zip(ids, states, strict=True) if _ended(s)]
    if ended:
        yield [("ZREM", inflight, *ended)]


def _ended(state: Any) -> bool:
    return state is None or RequestState(text(state)).terminal


def hold_commands(
    keys: Keys, bucket: str, member: str, request_id: str | None, now_ms: int
) -> list[tuple[Any, ...]]:
    """Move a placeholder's place to its queued request, or free it (``request_id`` None)."""
    inflight = _key(keys, bucket, "inflight")
    moved = [("ZADD", inflight, now_ms, request_id)] if request_id else []
    return [*moved, ("ZREM", inflight, member)]


def limited_enqueue_flow(
    keys: Keys,
    settings: Settings,
    bucket: str,
    limits: Limits,
    reqs: Sequence[GenerationRequest],
    now_ms: int,
) -> Flow[tuple[list[Enqueued], Verdict | None]]:
    """Admit the requests under the limits one by one and enqueue those admitted. The
    last verdict: the first refusal (the rest are not tried), else the last admission
    (its figures are the x-ratelimit-* headers); None for no requests."""
    admitted: list[tuple[GenerationRequest, str]] = []
    last: Verdict | None = None
    for req in reqs:
        last, member = yield from admit_flow(keys, settings, bucket, limits, req)
        if not last.ok:
            break
        admitted.append((req, member))
    enqueued = yield from enqueue_flow(keys, settings, [r for r, _ in admitted])
    yield [
        c
        for (_, member), e in zip(admitted, enqueued, strict=True)
        for c in hold_commands(keys, bucket, member, _held_id(e), now_ms)
    ]
    return enqueued, last


def _held_id(enqueued: Enqueued) -> str | None:
    """The id that holds a place: a newly queued request (a duplicate holds none)."""
    return None if enqueued.duplicate or enqueued.refused is not None else enqueued.request_id


def rate_limited(verdict: Verdict) -> RateLimited:
    seconds = verdict.retry_after_ms / 1000
    messages = {
        "requests": f"{verdict.limit_requests} requests per minute",
        "tokens": f"{verdict.limit_tokens} tokens per minute",
        "concurrent": "its concurrent requests",
    }
    if verdict.verdict == "too_large":
        return RateLimited(
            f"this request counts more tokens (prompt + max_tokens) than this API key may use "
            f"in a minute ({verdict.limit_tokens}); lower max_tokens or shorten the prompt",
            None,
            headers(verdict),
        )
    return RateLimited(
        f"rate limit reached: this API key is over {messages[verdict.verdict]}; "
        f"retry in {seconds:.3g}s",
        seconds,
        headers(verdict),
    )


def headers(verdict: Verdict) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for the limits that are set."""
    out: dict[str, str] = {}
    for kind, limit, remaining, reset_ms in (
        ("requests", verdict.limit_requests, verdict.remaining_requests, verdict.reset_requests_ms),
        ("tokens", verdict.limit_tokens, verdict.remaining_tokens, verdict.reset_tokens_ms),
    ):
        if limit:
            out[f"x-ratelimit-limit-{kind}"] = str(limit)
            out[f"x-ratelimit-remaining-{kind}"] = str(remaining)
            out[f"x-ratelimit-reset-{kind}"] = duration_text(reset_ms)
    return out


def duration_text(ms: int) -> str:
    """OpenAI's form: '20ms', '1.5s', '6m0s'."""
    if ms < 1000:
        return f"{max(0, ms)}ms"
    minutes, rest_ms = divmod(ms, 60_000)
    seconds = f"{rest_ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


def retry_after_header(seconds: float) -> str:
    """Whole seconds, rounded up, at least 1: a client that waits this long fits."""
    return str(max(1, math.ceil(seconds)))
