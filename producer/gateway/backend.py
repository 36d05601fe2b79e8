"""What the routes do with Redis: submit, read, cancel and follow requests."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Annotated

import redis.asyncio
from fastapi import Depends, Request

from producer.gateway.auth import Principal
from producer.gateway.config import GatewayConfig
from producer.gateway.errors import ApiError
from producer.gateway.hub import StreamHub, parse_cursor, parse_gateway_entry
from producer.gateway.metrics import GatewayMetrics
from producer.gateway.refused import refused
from producer.gateway.registry import ModelRegistry
from producer.gateway.tracing import StreamTraces, with_incoming
from producer.requests import validate_request
from producer.streams.entries import Entry, UnrepeatedEntries
from producer.submit import AsyncSubmit
from shared.errors import NotFound
from shared.flows import cancel_flow, drive_async
from shared.keys import Keys
from shared.limits import AsyncLimitsCache
from shared.loras import split_model
from shared.models import (
    TENANT,
    FinalEvent,
    GenerationRequest,
    RequestStatus,
    Result,
)
from shared.reads import run_read_async, view_read
from shared.refusal import RequestRefused
from shared.replication import Replicas
from shared.replies import text
from shared.scripts import AsyncScripts
from shared.settings import Settings


@dataclass(frozen=True)
class Submitted:
    request_id: str
    duplicate: bool
    request: GenerationRequest
    rate_headers: dict[str, str] = field(default_factory=dict)  # x-ratelimit-*, if limited


class Backend:
    def __init__(
        self,
        settings: Settings,
        config: GatewayConfig,
        connection: redis.asyncio.Redis,
        hub: StreamHub,
        metrics: GatewayMetrics,
    ) -> None:
        self.settings = settings
        self.config = config
        self.redis = connection
        self.keys = Keys(settings.namespace)
        self.hub = hub
        self.metrics = metrics
        self.registry = ModelRegistry(connection, self.keys, config.models_cache_s)
        self.limits = AsyncLimitsCache(connection, self.keys)  # what the model's workers take
        self._scripts = AsyncScripts(connection, Replicas.of(settings))
        self._submit = AsyncSubmit(self.keys, settings, self._scripts, self.limits)
        self.traces = StreamTraces(connection, self.keys)

    async def submit(self, request: GenerationRequest, api: str, caller: Principal) -> Submitted:
        """Enqueue ``request``; UnknownModel (404) for a model no worker has served lately
        (the enqueue script decides, per TOKENQ_REQUIRE_KNOWN_MODEL); RateLimited (429)
        when the caller's key is over a limit; a 400 in ``api``'s shape, naming the
        field, for what the model's registered limits refuse. The caller's key sets its
        tenant and weight (``producer.submit``, the path every client takes too)."""
        try:  # what no worker of the model would run is refused before it is queued
            done = await self._submit(caller.submitter, [with_incoming(request)])
        except RequestRefused as e:
            raise refused(e, api) from e
        (enqueued,), (queued,) = done.enqueued, done.requests
        self.traces.submitted(enqueued.request_id, queued)
        if not enqueued.duplicate:
            self.metrics.accepted(queued.model, queued.priority, api)
        return Submitted(enqueued.request_id, enqueued.duplicate, queued, done.rate_headers)

    async def with_adapter(self, request: GenerationRequest) -> GenerationRequest:
        """``model: "base:adapter"`` (an OpenAI body's way to name a LoRA adapter) as
        model ``base`` with ``lora`` set, unless a live worker serves the whole name."""
        split = None if request.lora else split_model(request.model)
        if split is None or request.model in await self.registry.live():
            return request
        base, adapter = split
        data = {**request.model_dump(), "model": base, "lora": adapter}
        return validate_request(self.settings, data)

    async def view(
        self, request_id: str, scope: str | None = None
    ) -> tuple[RequestStatus, Result | None]:
        """Status (with queue position) and the result once there is one, in one round
        trip. With a ``scope`` (a tenant), another tenant's request is NotFound."""
        status, result = await run_read_async(self.redis, view_read(self.keys, request_id))
        _require_owner(request_id, status.tenant, scope)
        return status, result

    async def status(self, request_id: str, scope: str | None = None) -> RequestStatus:
        return (await self.view(request_id, scope))[0]

    async def cancel(self, request_id: str, scope: str | None = None) -> str:
        """'cancelled' (was queued), 'requested' (running: its worker stops it) or 'done'.
        With a ``scope``, another tenant's request is NotFound and left alone."""
        if scope is not None:  # a request's tenant never changes, so check it first
            owner = await self.redis.hget(self.keys.request(request_id), TENANT)
            _require_owner(request_id, None if owner is None else text(owner), scope)
        flow = cancel_flow(self.keys, self.settings, request_id)
        return await drive_async(self._scripts, flow)

    def events(self, request_id: str, after: str = "0-0") -> AsyncGenerator[list[Entry]]:
        """The request's stream after ``after`` in batches, through its final event. An
        empty batch marks a quiet spell (send a keep-alive); NotFound if the request
        vanishes meanwhile. Traced as a stream span when tracing is on."""
        return self.traces.stream(request_id, self._events(request_id, after))

    async def final(
        self, request_id: str, feed: Callable[[Entry], object] | None = None
    ) -> FinalEvent:
        """Read the request's stream to its final event, handing each entry before it to
        ``feed``; NotFound if the stream ends without one."""
        async for batch in self.events(request_id):
            for entry in batch:
                if entry.is_final:
                    return entry.final()
                if feed is not None:
                    feed(entry)
        raise NotFound(f"request {request_id} ended without a final event")

    def finished(self, submitted: Submitted, final: FinalEvent) -> None:
        """Count ``final`` in the metrics, unless it is an idempotent repeat's (the first
        caller's request, counted there)."""
        if not submitted.duplicate:
            self.metrics.finished(submitted.request.model, submitted.request.priority, final)

    async def _events(self, request_id: str, after: str) -> AsyncGenerator[list[Entry]]:
        unrepeated = UnrepeatedEntries()  # what a failover makes a worker write again
        if after != "0-0":
            after, final = await self._resume_point(request_id, after)
            if final is not None:  # resumed at or past the end: the end, at once
                yield [final]
                return
        async for batch in self.hub.subscribe(self.keys.stream(request_id), after):
            if not batch:
                await self._check_exists(request_id)
            batch = unrepeated.entries(batch)
            for n, entry in enumerate(batch):
                if entry.is_final:
                    yield batch[: n + 1]
                    return
            yield batch

    async def _resume_point(self, request_id: str, after: str) -> tuple[str, Entry | None]:
        """Where to read from for a client resuming after ``after``, and the final event
        when the stream ended at or before it. Nothing lies between the stream's last
        entry and a cursor past it, so reading goes on from that entry (a cursor ahead
        of Redis's clock would otherwise miss every entry still to come)."""
        key = self.keys.stream(request_id)
        found = await self.redis.xrevrange(key, count=1)
        if not found:
            return "0-0", None
        entry_id, fields = found[0]
        last_id = text(entry_id)
        if parse_cursor(last_id) > parse_cursor(after):
            return after, None
        last = parse_gateway_entry(key, last_id, fields)
        return last_id, (last[0] if last and last[0].is_final else None)

    async def _check_exists(self, request_id: str) -> None:
        if not await self.redis.exists(self.keys.request(request_id)):
            raise _missing(request_id)


def _require_owner(request_id: str, tenant: str | None, scope: str | None) -> None:
    """Another tenant's request looks exactly like one that does not exist."""
    if scope is not None and tenant != scope:
        raise _missing(request_id)


def _missing(request_id: str) -> NotFound:
    return NotFound(f"request {request_id} does not exist (or has expired)")


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"model {model!r} is not served by any live worker; "
        "GET /v1/models lists the models served now",
        type="not_found_error",
        param="model",
        code="model_not_found",
    )


def get_backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


BackendDep = Annotated[Backend, Depends(get_backend)]
