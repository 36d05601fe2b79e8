"""Server-sent events: framing, and a response that notices when its client leaves.

Starlette's StreamingResponse only learns of a disconnect when a write fails, which
for a request still queued may be minutes later; ``SSEResponse`` listens for the
ASGI disconnect message while it streams and then runs ``on_disconnect`` (shielded
from the cancellation, so a cancel reaches Redis).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

KEEPALIVE = b": keep-alive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
T = TypeVar("T")


def frame(data: bytes | str, *, event_id: str | None = None, event: str | None = None) -> bytes:
    """One SSE message; ``data`` must hold no newline (JSON from orjson never does)."""
    head = b""
    if event_id is not None:
        head += b"id: " + event_id.encode() + b"\n"
    if event is not None:
        head += b"event: " + event.encode() + b"\n"
    body = data.encode() if isinstance(data, str) else data
    return head + b"data: " + body + b"\n\n"


class SSEResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncIterator[bytes],
        *,
        headers: dict[str, str] | None = None,
        on_disconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.body_iterator = body
        self.on_disconnect = on_disconnect
        self.status_code = 200
        self.background = None
        self.init_headers({**SSE_HEADERS, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        async with anyio.create_task_group() as group:

            async def stream() -> None:
                nonlocal completed
                try:
                    completed = await self._stream(send)
                finally:
                    group.cancel_scope.cancel()

            group.start_soon(stream)
            await _wait_for_disconnect(receive)
            group.cancel_scope.cancel()
        if not completed and self.on_disconnect is not None:
            with anyio.CancelScope(shield=True):
                await self.on_disconnect()

    async def _stream(self, send: Send) -> bool:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            return False  # the client went away mid-write
        return True


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """``work``'s result, or ``None`` if the client disconnects first (``work`` is cancelled)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (watcher, task):
            if not pending.done():
                pending.cancel()
        await asyncio.gather(watcher, task, return_exceptions=True)
    return None if task.cancelled() else task.result()
