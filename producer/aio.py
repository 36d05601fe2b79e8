"""The asyncio client: the same surface as ``producer.Client``, awaitable."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import redis.asyncio

from producer.client import _block_ms, _deadline
from producer.keyed import as_tenant, find_key, submit_flow
from producer.requests import build_embed_requests, build_request, embedding_of, validate_request
from shared.connection import connect_async
from shared.flows import accepted, cancel_flow, drive_async
from shared.keys import Keys, tag_of
from shared.models import FinalEvent, GenerationRequest, RequestStatus, Result, StreamEvent
from shared.reads import (
    parse_xread,
    position_read,
    result_read,
    run_read_async,
    status_read,
)
from shared.scripts import AsyncScripts
from shared.settings import Settings, get_settings

BLOCK_MS = 2_000


class AsyncClient:
    """Talks to tokenq through Redis with redis.asyncio."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        connection: redis.asyncio.Redis | None = None,
        settings: Settings | None = None,
        api_key: str | None = None,
    ) -> None:
        self.settings = settings or get_settings()
        self.api_key = None if api_key is None else find_key(self.settings, api_key)
        url = redis_url or self.settings.redis_url
        self.redis = connection or connect_async(url, self.settings.redis_cluster)
        self.keys = Keys(self.settings.namespace)
        self._scripts = AsyncScripts(self.redis)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.redis.aclose()

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
        reqs = [validate_request(self.settings, r) for r in requests]
        if self.api_key is not None:
            reqs = [as_tenant(r, self.api_key) for r in reqs]
        flow = submit_flow(self.keys, self.settings, self.api_key, reqs)
        enqueued = await drive_async(self._scripts, flow)
        return [AsyncHandle(self, i) for i in accepted(enqueued, reqs, self.settings)]

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
    ) -> AsyncIterator[StreamEvent]:
        """Token events as they arrive, then the final event; resume with ``after``.
        RequestTimeout if the final event has not come within ``timeout`` seconds."""
        cursor, give_up = after, _deadline(timeout)
        while True:
            events = await self._read(cursor, _block_ms(give_up, timeout, self.id))
            for event in events:
                cursor = event.id
                yield event
                if isinstance(event.event, FinalEvent):
                    return
            if not events:
                await self.status()

    async def _read(self, cursor: str, block_ms: int = BLOCK_MS) -> list[StreamEvent]:
        key = self.client.keys.stream(self.id)
        reply = await self.client.redis.xread({key: cursor}, block=block_ms, count=512)
        return parse_xread(reply)

    async def result(self, timeout: float | None = None) -> Result:
        give_up, cursor = _deadline(timeout), "0-0"
        while True:
            result = await run_read_async(self.client.redis, result_read(self.client.keys, self.id))
            if result is not None:
                return result
            events = await self._read(cursor, _block_ms(give_up, timeout, self.id))
            cursor = events[-1].id if events else cursor
