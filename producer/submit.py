"""The one submit path: ``Client``, ``AsyncClient`` (with or without an API key) and every
gateway route submit through it.

``Submit(...)(submitter, requests)`` (``AsyncSubmit`` awaited) validates the requests,
sets each one's tenant and weight from the submitter (``as_submitted``: the only place a
request's tenant is set; nothing a body or its metadata says counts), checks them
against the limits the model's workers registered (before anything is queued), and
enqueues them under the submitter's rate limits in one round trip, traced.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from producer.api_keys import ApiKey
from producer.requests import validate_request
from producer.traced import submit_spans
from shared.flows import Enqueued, Flow, accepted, drive, drive_async, enqueue_flow
from shared.keys import Keys
from shared.limits import AsyncLimitsCache, LimitsCache
from shared.models import GenerationRequest
from shared.ratelimit import Limits, Verdict, headers, limited_enqueue_flow, rate_limited
from shared.scripts import AsyncScripts, Scripts
from shared.settings import Settings

Requests = Iterable[GenerationRequest | Mapping[str, Any]]


@dataclass(frozen=True)
class Submitter:
    """Who submits: the tenant its requests count to (None: no tenant, as a plain
    ``Client`` submits), its weight within a priority, and its rate limits."""

    tenant: str | None = None
    weight: float = 1.0
    limits: Limits = field(default_factory=Limits)
    bucket: str = ""  # its rate limits' name in Redis

    @classmethod
    def of_key(cls, key: ApiKey) -> Submitter:
        return cls(key.tenant, key.weight, key.limits, key.bucket)


def as_submitted(request: GenerationRequest, submitter: Submitter) -> GenerationRequest:
    """``request`` as ``submitter`` submits it: its tenant and weight, whatever it said."""
    return request.model_copy(
        update={"tenant": submitter.tenant, "tenant_weight": submitter.weight}
    )


@dataclass(frozen=True)
class Submitted:
    """The requests as queued (traced), their ids, and the rate limits' figures."""

    requests: list[GenerationRequest]
    enqueued: list[Enqueued]
    request_ids: list[str]
    verdict: Verdict | None = None

    @property
    def rate_headers(self) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers, when the submitter has rate limits."""
        return {} if self.verdict is None else headers(self.verdict)


def prepared(
    settings: Settings, submitter: Submitter, requests: Requests
) -> list[GenerationRequest]:
    return [as_submitted(validate_request(settings, r), submitter) for r in requests]


def enqueued_flow(
    keys: Keys, settings: Settings, submitter: Submitter, reqs: Sequence[GenerationRequest]
) -> Flow[tuple[list[Enqueued], Verdict | None]]:
    """Enqueue, under the submitter's rate limits when it has any: RateLimited for the
    first request over a limit (those before it stay accepted, as with QueueFull)."""
    if not submitter.limits.any:
        return (yield from enqueue_flow(keys, settings, list(reqs))), None
    now_ms = int(time.time() * 1000)
    flow = limited_enqueue_flow(keys, settings, submitter.bucket, submitter.limits, reqs, now_ms)
    enqueued, verdict = yield from flow
    if verdict is not None and not verdict.ok:
        raise rate_limited(verdict)
    return enqueued, verdict


@dataclass(frozen=True)
class Submit:
    """The submit path over a blocking Redis client."""

    keys: Keys
    settings: Settings
    scripts: Scripts
    limits: LimitsCache

    def __call__(self, submitter: Submitter, requests: Requests) -> Submitted:
        reqs = prepared(self.settings, submitter, requests)
        self.limits.check(reqs)
        with submit_spans(reqs) as traced:
            flow = enqueued_flow(self.keys, self.settings, submitter, traced.requests)
            enqueued, verdict = drive(self.scripts, flow)
            traced.enqueued(enqueued)
            ids = accepted(enqueued, traced.requests, self.settings)
        return Submitted(traced.requests, enqueued, ids, verdict)


@dataclass(frozen=True)
class AsyncSubmit:
    """The submit path over redis.asyncio."""

    keys: Keys
    settings: Settings
    scripts: AsyncScripts
    limits: AsyncLimitsCache

    async def __call__(self, submitter: Submitter, requests: Requests) -> Submitted:
        reqs = prepared(self.settings, submitter, requests)
        await self.limits.check(reqs)
        with submit_spans(reqs) as traced:
            flow = enqueued_flow(self.keys, self.settings, submitter, traced.requests)
            enqueued, verdict = await drive_async(self.scripts, flow)
            traced.enqueued(enqueued)
            ids = accepted(enqueued, traced.requests, self.settings)
        return Submitted(traced.requests, enqueued, ids, verdict)
