"""The asyncio client: the same surface as ``producer.Client``, awaitable."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from typing import Any

import redis.asyncio

from producer.client import submitter_for
from producer.following import (
    BLOCK_MS,
    MAX_LOOKUPS,
    Unrepeated,
    block_ms,
    deadline_of,
    has_final,
    parse_events,
    result_or_tail,
)
from producer.requests import build_embed_requests, build_request, embedding_of
from producer.streams.aio import AsyncFollower, AsyncHub, async_source
from producer.submit import AsyncSubmit, Submitter
from shared.connection import UNREACHABLE, connect_async
from shared.flows import cancel_flow, drive_async
from shared.keys import Keys, tag_of
from shared.limits import AsyncLimitsCache
from shared.models import FinalEvent, GenerationRequest, RequestStatus, Result, StreamEvent
from shared.reads import position_read, result_read, run_read_async, status_read
from shared.replication import Replicas
from shared.scripts import AsyncScripts
from shared.settings import Settings, get_settings

log = logging.getLogger(__name__)


class AsyncClient:
    """Talks to tokenq through Redis with redis.asyncio."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        connection: redis.asyncio.Redis | None = None,
        settings: Settings | None = None,
        api_key: str | None = None,
        submitter: Submitter | None = None,
    ) -> None:
        """As ``Client``'s."""
        self.settings = settings or get_settings()
        self.submitter = submitter_for(self.settings, api_key, submitter)
        url = redis_url or self.settings.redis_url
        self.redis = connection or connect_async(url, self.settings.redis_cluster)
        self.keys = Keys(self.settings.namespace)
        self._scripts = AsyncScripts(self.redis, Replicas.of(self.settings))
        self._limits = AsyncLimitsCache(self.redis, self.keys)  # what the model's workers take
        self._submit = AsyncSubmit(self.keys, self.settings, self._scripts, self._limits)
        self._hub: AsyncHub[StreamEvent] | None = None
        # Followers look Redis up on quiet spells, all at once if all are quiet: a few
        # at a time, so thousands of them never need more than the pool holds.
        self._lookups = asyncio.Semaphore(MAX_LOOKUPS)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._hub is not None:
            await self._hub.stop()
            self._hub = None
        await self.redis.aclose()

    def _streams(self) -> AsyncHub[StreamEvent]:
        """The one reader every stream of this client is followed through (per node on
        a Redis Cluster), started on first use in the running loop."""
        if self._hub is None:
            self._hub = AsyncHub(async_source(self.redis), parse_events, BLOCK_MS / 1000)
            self._hub.start()
        return self._hub

    async def submit(self, prompt: str | None = None, **kwargs: Any) -> AsyncHandle:
        return await self.submit_request(build_request(self.settings, prompt, **kwargs))

    async def submit_request(self, request: GenerationRequest | Mapping[str, Any]) -> AsyncHandle:
        return (await self.submit_many([request]))[0]

    async def embed(
        self, texts: str | Sequence[str], *, timeout: float | None = None, **kwargs: Any
    ) -> list[list[float]]:
        """As ``Client.embed``."""
        handles = await self.submit_many(build_embed_requests(self.settings, texts, **kwargs))
        return [embedding_of(await handle.result(timeout)) for handle in handles]

    async def submit_many(
        self, requests: Iterable[GenerationRequest | Mapping[str, Any]]
    ) -> list[AsyncHandle]:
        submitted = await self._submit(self.submitter, requests)
        return [AsyncHandle(self, i) for i in submitted.request_ids]

    def handle(self, request_id: str) -> AsyncHandle:
        tag_of(request_id)
        return AsyncHandle(self, request_id)


class AsyncHandle:
    def __init__(self, client: AsyncClient, request_id: str) -> None:
        self.client = client
        self.id = request_id

    def __repr__(self) -> str:
        return f"AsyncHandle({self.id!r})"

    async def status(self) -> RequestStatus:
        return await run_read_async(self.client.redis, status_read(self.client.keys, self.id))

    async def position(self) -> int | None:
        return await run_read_async(self.client.redis, position_read(self.client.keys, self.id))

    async def cancel(self) -> str:
        c = self.client
        return await drive_async(c._scripts, cancel_flow(c.keys, c.settings, self.id))

    async def stream(
        self, after: str = "0-0", timeout: float | None = None
    ) -> AsyncGenerator[StreamEvent]:
        """Token events as they arrive, then the final event; resume with ``after``.
        RequestTimeout if the final event has not come within ``timeout`` seconds.
        Every stream of a client is read by one shared reader (one connection)."""
        give_up, c, unrepeated = deadline_of(timeout), self.client, Unrepeated()
        async with c._streams().follow(c.keys.stream(self.id), after) as follower:
            while True:
                events = await _next(follower, _wait_ms(give_up, timeout, self.id))
                for event in unrepeated.events(events):
                    yield event
                    if isinstance(event.event, FinalEvent):
                        return
                if not events:
                    async with c._lookups:
                        await self._look()  # raises NotFound if the request is gone

    async def _look(self) -> None:
        """As ``Handle._look``."""
        try:
            await self.status()
        except UNREACHABLE as e:
            log.info("looking up %s failed (%s); still waiting", self.id, e)

    async def _result(self) -> Result | None:
        try:
            return await run_read_async(self.client.redis, result_read(self.client.keys, self.id))
        except UNREACHABLE as e:
            log.info("reading the result of %s failed (%s); still waiting", self.id, e)
            return None

    async def result(self, timeout: float | None = None) -> Result:
        give_up, c = deadline_of(timeout), self.client
        async with c._lookups:
            result, tail = await run_read_async(c.redis, result_or_tail(c.keys, self.id))
        if result is not None:
            return result
        async with c._streams().follow(c.keys.stream(self.id), tail) as follower:
            while True:
                events = await _next(follower, _wait_ms(give_up, timeout, self.id))
                if not events or has_final(events):  # ended, or a quiet spell: look
                    async with c._lookups:
                        result = await self._result()
                    if result is not None:
                        return result


async def _next(follower: AsyncFollower[StreamEvent], wait_ms: int | None) -> list[StreamEvent]:
    """The follower's next batch, or nothing after ``wait_ms`` (without a limit, the
    hub's own timer marks quiet spells: no timer per wait)."""
    if wait_ms is None:
        return await follower.next()
    try:
        return await asyncio.wait_for(follower.next(), wait_ms / 1000)
    except TimeoutError:
        return []


def _wait_ms(give_up: float | None, timeout: float | None, request_id: str) -> int | None:
    return None if give_up is None else block_ms(give_up, timeout, request_id)
