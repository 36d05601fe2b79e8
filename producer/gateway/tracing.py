"""The gateway's part of a trace: the caller's ``traceparent`` header, and the
``tokenq.stream`` span over the events a route reads (SSE or a whole answer).

The header is read by a dependency of the routes that submit or follow a request and
kept for the request's task; ``Backend.submit`` traces the submit under it. A stream's
span goes under the request's submit span: remembered here when this gateway submitted
it, else read from the request's record (another gateway's submit), else under the
caller's header. With tracing off nothing here runs but the header's check.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncGenerator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Annotated, Any

import redis.asyncio
from fastapi import Depends, Header
from pydantic import ValidationError

from producer.openai.errors import invalid
from producer.streams.entries import Entry
from producer.traced import STREAM_SPAN
from shared import tracing
from shared.keys import Keys
from shared.models import GenerationRequest

if TYPE_CHECKING:
    from opentelemetry.trace import Span

# Streams whose parent this gateway remembers from their submit, newest kept.
MAX_REMEMBERED = 10_000
_incoming: ContextVar[str | None] = ContextVar("tokenq_traceparent", default=None)


async def read_traceparent(
    traceparent: Annotated[
        str | None,
        Header(description="W3C trace context: the request's spans go under it"),
    ] = None,
) -> None:
    """Keep the caller's traceparent for this request (400 naming it if malformed)."""
    if traceparent is not None:
        try:
            tracing.check_traceparent(traceparent)
        except ValueError as e:
            raise invalid(f"invalid request: header.traceparent: {e}", "traceparent") from e
    _incoming.set(traceparent)


TRACEPARENT = Depends(read_traceparent)


def with_incoming(request: GenerationRequest) -> GenerationRequest:
    """``request`` under the caller's traceparent header, if it sent one."""
    incoming = _incoming.get()
    if incoming is None or request.traceparent is not None:
        return request
    return request.model_copy(update={"traceparent": incoming})


class StreamTraces:
    """The parents of streams to come, and the stream spans."""

    def __init__(self, connection: redis.asyncio.Redis, keys: Keys) -> None:
        self.redis = connection
        self.keys = keys
        self._parents: OrderedDict[str, GenerationRequest] = OrderedDict()

    def submitted(self, request_id: str, request: GenerationRequest) -> None:
        if request.traceparent is None or tracing.tracer() is None:
            return
        self._parents[request_id] = request
        while len(self._parents) > MAX_REMEMBERED:
            self._parents.popitem(last=False)

    def stream(
        self, request_id: str, events: AsyncGenerator[list[Entry]]
    ) -> AsyncGenerator[list[Entry]]:
        """``events`` itself with tracing off, else followed in a stream span."""
        tracer = tracing.tracer()
        return events if tracer is None else self._traced(tracer, request_id, events)

    async def _traced(
        self, tracer: Any, request_id: str, events: AsyncGenerator[list[Entry]]
    ) -> AsyncGenerator[list[Entry]]:
        request = self._parents.pop(request_id, None) or await self._recorded(request_id)
        attributes = {} if request is None else tracing.request_attributes(request)
        attributes["tokenq.request.id"] = request_id
        parent = _incoming.get() if request is None else request.traceparent
        span = tracing.start_span(tracer, STREAM_SPAN, parent, attributes)
        try:
            async for batch in events:
                if batch and batch[-1].is_final:  # its reader may stop once it has this
                    _ended(span, batch[-1])
                    yield batch
                    return
                yield batch
        except Exception as e:
            tracing.fail(span, e)
            raise
        finally:
            await events.aclose()
            if span.is_recording():
                span.end()

    async def _recorded(self, request_id: str) -> GenerationRequest | None:
        """The request as its record holds it (None if it cannot be read)."""
        payload = await self.redis.hget(self.keys.request(request_id), "payload")
        try:
            return None if payload is None else GenerationRequest.model_validate_json(payload)
        except ValidationError:
            return None


def _ended(span: Span, final_entry: Entry) -> None:
    """The final event's figures on the span, which ends with it."""
    final = final_entry.final()
    span.set_attribute("gen_ai.usage.input_tokens", final.usage.prompt_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", final.usage.completion_tokens)
    span.set_attribute("gen_ai.response.finish_reasons", [final.finish_reason.value])
    span.end()
