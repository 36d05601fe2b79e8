"""Anthropic-compatible routes: ``/v1/messages`` (whole or streamed) and
``/v1/messages/count_tokens``. They submit through the same path as the chat route
(one queued request, the caller's tenant, priority, fair share and rate limits), so a
message is cancellable, survives a worker's death, and a client that leaves cancels
it. Errors take Anthropic's shape (``producer.gateway.errors`` answers so for these
paths); ``x-api-key`` is read as a key (``producer.gateway.auth``); the
``anthropic-version`` header is accepted, whatever its value."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import redis
from fastapi import APIRouter, Request, Response

from producer.anthropic.errors import anthropic_error_responses
from producer.anthropic.output import MessageRenderer, error_event, failure
from producer.anthropic.requests import messages_plan
from producer.anthropic.schemas import CountTokensRequest, MessagesRequest
from producer.gateway.auth import Caller
from producer.gateway.backend import Backend, BackendDep, Submitted
from producer.gateway.errors import map_tokenq_error
from producer.gateway.openai_routes import (
    CLIENT_CLOSED,
    REFUSAL_WAIT_S,
    REQUEST_ID_HEADER,
    Head,
    cancel_all,
    chat_features,
    origin,
    submit_all,
)
from producer.gateway.sse import KEEPALIVE, SSEResponse, unless_disconnected
from producer.gateway.tokenizer_calls import ask_tokenizer, tokenizer_request
from shared.errors import TokenqError
from shared.models import FinalEvent

router = APIRouter(prefix="/v1/messages", tags=["anthropic"])
ERRORS = anthropic_error_responses(400, 401, 403, 404, 429, 500, 503)
API = "messages"
_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
}
STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the message, or with stream: true Anthropic's events as SSE",
        "content": {
            "application/json": {"schema": {"type": "object", "title": "Message"}},
            "text/event-stream": {"schema": _EVENT},
        },
    }
}


@router.post("", responses={**STREAMED, **ERRORS})
async def messages(
    body: MessagesRequest, request: Request, caller: Caller, backend: BackendDep
) -> Response:
    """Create a message (Anthropic-compatible; tokenq fields as extra body fields)."""
    features = await chat_features(backend, body.model)
    plan = messages_plan(body, origin(caller, body.priority), features)
    (submitted,) = await submit_all(backend, plan.requests, API, caller)
    renderer = MessageRenderer(submitted.request_id, body.model, plan.tools, plan.reasoning)
    headers = {REQUEST_ID_HEADER: submitted.request_id, **submitted.rate_headers}
    if body.stream:
        return await _stream_unless_refused(backend, submitted, renderer, headers)
    final = await unless_disconnected(request, _collect(backend, submitted, renderer))
    if final is None:
        await _client_left(backend, submitted)
        return Response(status_code=CLIENT_CLOSED)
    error = failure(final)
    if error is not None:
        raise error
    renderer.end(final)
    content = orjson.dumps(renderer.message(final))
    return Response(content, media_type="application/json", headers=headers)


@router.post("/count_tokens", responses=ERRORS)
async def count_tokens(
    body: CountTokensRequest, request: Request, caller: Caller, backend: BackendDep
) -> dict[str, int]:
    """The prompt's tokens (system, messages and tools through the chat template), as
    the same body sent to ``/v1/messages`` would use: ``{"input_tokens": N}``."""
    features = await chat_features(backend, body.model)
    plan = messages_plan(body, origin(caller, body.priority), features)
    gen = tokenizer_request(plan.requests[0], "tokenize", caller, body.priority is not None)
    names = {"prompt": "messages", "prompt_token_ids": "messages"}
    final = await ask_tokenizer(backend, caller, gen, request, "count_tokens", names)
    return {"input_tokens": len(final.prompt_token_ids or ())}


async def _collect(backend: Backend, submitted: Submitted, renderer: MessageRenderer) -> FinalEvent:
    final = await backend.final(submitted.request_id, renderer.feed)
    backend.finished(submitted, final)
    return final


async def _stream_unless_refused(
    backend: Backend, submitted: Submitted, renderer: MessageRenderer, headers: dict[str, str]
) -> Response:
    """The stream; or the 400 a whole answer gets when the worker refuses the request
    before its first event (as the chat route does)."""
    events = backend.events(submitted.request_id)
    head = Head(events, asyncio.ensure_future(anext(events)))
    await asyncio.wait({head.first}, timeout=REFUSAL_WAIT_S)
    first = head.first
    if first.done() and not first.cancelled() and first.exception() is None:
        final = next((e.final() for e in first.result() if e.is_final), None)
        error = None if final is None else failure(final)
        if final is not None and error is not None and error.status == 400:
            await head.close()
            backend.finished(submitted, final)
            raise error
    return _stream(backend, submitted, renderer, headers, head)


def _stream(
    backend: Backend,
    submitted: Submitted,
    renderer: MessageRenderer,
    headers: dict[str, str],
    head: Head,
) -> SSEResponse:
    ended = False

    async def body() -> AsyncIterator[bytes]:
        nonlocal ended
        backend.metrics.streams.labels(API).inc()
        try:
            yield renderer.start()
            async for batch in head.batches():
                chunks, final = renderer.render(batch)
                if final is not None:
                    ended = True
                    backend.finished(submitted, final)
                    yield chunks
                    return
                yield chunks or KEEPALIVE
        except (TokenqError, redis.RedisError) as e:
            ended = True
            yield error_event(map_tokenq_error(e))
        finally:
            backend.metrics.streams.labels(API).dec()

    async def on_disconnect() -> None:
        if not ended:
            await _client_left(backend, submitted)

    return SSEResponse(body(), headers=headers, on_disconnect=on_disconnect)


async def _client_left(backend: Backend, submitted: Submitted) -> None:
    """An Anthropic caller cannot resume: its request is cancelled to free the slot."""
    backend.metrics.disconnects.labels(API).inc()
    await cancel_all(backend, [submitted])
