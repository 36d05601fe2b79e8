"""OpenAI-compatible routes: chat completions, completions, models."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import orjson
import redis
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from producer.gateway.auth import Caller
from producer.gateway.backend import Backend, BackendDep, Submitted, model_not_found
from producer.gateway.errors import error_responses, map_tokenq_error
from producer.gateway.openai_output import Renderer, failure
from producer.gateway.openai_requests import chat_request, completion_request
from producer.gateway.openai_schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from producer.gateway.registry import LiveModel
from producer.gateway.sse import KEEPALIVE, SSEResponse, unless_disconnected
from shared.errors import NotFound, TokenqError
from shared.models import FinalEvent, GenerationRequest

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["openai"])
REQUEST_ID_HEADER = "x-tokenq-request-id"
CLIENT_CLOSED = 499  # nginx's code: the client left before the answer


def _streamed(chunk: str) -> dict[int | str, dict[str, object]]:
    """The stream=true answer: in OpenAPI 3.1 an event stream's schema is one event's."""
    data = {"type": "string", "description": f"a {chunk} as JSON; [DONE] ends the stream"}
    event = {"type": "object", "required": ["data"], "properties": {"data": data}}
    doc = f"the completion, or with stream: true {chunk}s as SSE"
    return {200: {"content": {"text/event-stream": {"schema": event}}, "description": doc}}


ERRORS = error_responses(400, 401, 403, 404, 429, 500, 503, 504)
Whole = Callable[[FinalEvent], BaseModel]


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    responses={**_streamed("ChatCompletionChunk"), **ERRORS},
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, caller: Caller, backend: BackendDep
) -> Response:
    """Generate a chat reply (OpenAI-compatible; tokenq fields as extra body fields)."""
    gen = chat_request(body, caller)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    renderer = Renderer("chat", "", gen.model, include_usage)
    whole: Whole = lambda final: renderer.chat_completion(final, body.logprobs)  # noqa: E731
    return await _answer(request, backend, gen, body.stream, renderer, whole)


@router.post(
    "/completions", response_model=Completion, responses={**_streamed("Completion"), **ERRORS}
)
async def completions(
    body: CompletionRequest, request: Request, caller: Caller, backend: BackendDep
) -> Response:
    """Continue a prompt (OpenAI-compatible; one prompt per request)."""
    gen = completion_request(body, caller)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    renderer = Renderer("text", "", gen.model, include_usage)
    whole: Whole = lambda final: renderer.completion(final, body.logprobs is not None)  # noqa: E731
    return await _answer(request, backend, gen, body.stream, renderer, whole)


@router.get("/models", response_model=ModelList, responses=error_responses(401, 503))
async def list_models(_: Caller, backend: BackendDep) -> ModelList:
    """The models that live workers serve now."""
    live = await backend.registry.live()
    return ModelList(data=[_card(live[name]) for name in sorted(live)])


@router.get(
    "/models/{model:path}", response_model=ModelCard, responses=error_responses(401, 404, 503)
)
async def get_model(model: str, _: Caller, backend: BackendDep) -> ModelCard:
    live = await backend.registry.live()
    if model not in live:
        raise model_not_found(model)
    return _card(live[model])


def _card(model: LiveModel) -> ModelCard:
    return ModelCard(id=model.name, created=model.created_s, num_workers=model.num_workers)


async def _answer(
    request: Request,
    backend: Backend,
    gen: GenerationRequest,
    stream: bool,
    renderer: Renderer,
    whole: Whole,
) -> Response:
    submitted = await backend.submit(gen, api=renderer.kind)
    renderer.request_id = submitted.request_id
    headers = {REQUEST_ID_HEADER: submitted.request_id}
    if stream:
        return _stream(backend, submitted, renderer, headers)
    final = await unless_disconnected(request, _collect(backend, submitted, renderer))
    if final is None:
        await _client_left(backend, submitted, renderer)
        return Response(status_code=CLIENT_CLOSED)
    error = failure(final)
    if error is not None:
        raise error
    body = orjson.dumps(whole(final).model_dump(mode="json"))
    return Response(body, media_type="application/json", headers=headers)


async def _collect(backend: Backend, submitted: Submitted, renderer: Renderer) -> FinalEvent:
    async for batch in backend.events(submitted.request_id):
        for entry in batch:
            if entry.is_final:
                final = entry.final()
                _record(backend, submitted, final)
                return final
            renderer.add(entry)
    raise NotFound(f"request {submitted.request_id} ended without a final event")


def _stream(
    backend: Backend, submitted: Submitted, renderer: Renderer, headers: dict[str, str]
) -> SSEResponse:
    ended = False

    async def body() -> AsyncIterator[bytes]:
        nonlocal ended
        backend.metrics.streams.labels(renderer.kind).inc()
        try:
            if first := renderer.first_chunk():
                yield first
            async for batch in backend.events(submitted.request_id):
                chunks, final = renderer.render(batch)
                if final is not None:
                    ended = True
                    _record(backend, submitted, final)
                yield chunks or KEEPALIVE
        except (TokenqError, redis.RedisError) as e:
            ended = True
            yield renderer.error_chunk(map_tokenq_error(e).detail)
        finally:
            backend.metrics.streams.labels(renderer.kind).dec()

    async def on_disconnect() -> None:
        if not ended:
            await _client_left(backend, submitted, renderer)

    return SSEResponse(body(), headers=headers, on_disconnect=on_disconnect)


def _record(backend: Backend, submitted: Submitted, final: FinalEvent) -> None:
    if not submitted.duplicate:
        backend.metrics.finished(submitted.request.model, submitted.request.priority, final)


async def _client_left(backend: Backend, submitted: Submitted, renderer: Renderer) -> None:
    """An OpenAI caller cannot resume, so its request is cancelled to free the worker's
    slot; unless it was an idempotent repeat, whose request belongs to the first caller."""
    backend.metrics.disconnects.labels(renderer.kind).inc()
    if submitted.duplicate:
        return
    try:
        outcome = await backend.cancel(submitted.request_id)
        log.info("client left: cancel of %s %s", submitted.request_id, outcome)
    except (TokenqError, redis.RedisError) as e:
        log.warning("client left; could not cancel %s: %s", submitted.request_id, e)
