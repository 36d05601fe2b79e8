"""A response's events as SSE, built from its request's stream (``producer.responses.
events``): the same events and sequence numbers from any gateway, from the start or
after the sequence number a client saw last."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable

import orjson
import redis

from producer.gateway.backend import Backend, Submitted
from producer.gateway.errors import ErrorResponse, map_tokenq_error
from producer.gateway.openai_routes import cancel_all
from producer.gateway.sse import KEEPALIVE, SSEResponse, frame
from producer.responses.events import Event, EventBuilder
from producer.responses.record import StoredResponse
from producer.streams.entries import Entry
from shared.errors import NotFound, TokenqError

log = logging.getLogger(__name__)
API = "responses"


def frames(events: Iterable[Event], after: int) -> bytes:
    """The SSE frames of the events past sequence number ``after``."""
    return b"".join(
        frame(orjson.dumps(e), event=e["type"]) for e in events if e["sequence_number"] > after
    )


def event_stream(
    backend: Backend,
    record: StoredResponse,
    after: int = -1,
    submitted: Submitted | None = None,
    headers: dict[str, str] | None = None,
) -> SSEResponse:
    """The events after sequence number ``after`` through the terminal one. With
    ``submitted`` (the POST that made it), a foreground response is cancelled when its
    client leaves, as a chat stream is; a background one runs on."""
    builder = EventBuilder(record)
    failed = False

    async def body() -> AsyncIterator[bytes]:
        nonlocal failed
        backend.metrics.streams.labels(API).inc()
        try:
            yield frames(builder.opening(), after) or KEEPALIVE
            async for batch in backend.events(record.request_id):
                yield frames(_fed(builder, batch), after) or KEEPALIVE
                if builder.final is not None and submitted is not None:
                    _record(backend, submitted, builder)
        except (TokenqError, redis.RedisError) as e:
            failed = True
            yield frame(ErrorResponse(error=map_tokenq_error(e).detail).model_dump_json(),
                        event="error")  # fmt: skip
        finally:
            backend.metrics.streams.labels(API).dec()

    async def on_disconnect() -> None:
        if submitted is None or record.background or failed or builder.final is not None:
            return
        backend.metrics.disconnects.labels(API).inc()
        await cancel_all(backend, [submitted])

    return SSEResponse(body(), headers=headers, on_disconnect=on_disconnect)


def _fed(builder: EventBuilder, batch: list[Entry]) -> list[Event]:
    return [event for entry in batch for event in builder.feed(entry)]


async def collected(backend: Backend, request_id: str, after: str = "0-0") -> list[Entry]:
    """The request's entries after ``after`` through its final one."""
    entries: list[Entry] = []
    async for batch in backend.events(request_id, after):
        entries.extend(batch)
    if not entries or not entries[-1].is_final:
        raise NotFound(f"request {request_id} ended without a final event")
    return entries


def _record(backend: Backend, submitted: Submitted, builder: EventBuilder) -> None:
    if not submitted.duplicate and builder.final is not None:
        backend.metrics.finished(submitted.request.model, submitted.request.priority, builder.final)
