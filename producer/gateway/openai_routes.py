"""OpenAI-compatible routes: chat completions, completions, models."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import orjson
import redis
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from producer.gateway.auth import Caller, Principal, priority_for
from producer.gateway.backend import Backend, BackendDep, Submitted, model_not_found
from producer.gateway.errors import error_responses, map_tokenq_error
from producer.gateway.sse import KEEPALIVE, SSEResponse, unless_disconnected
from producer.gateway.tracing import TRACEPARENT
from producer.openai.output import (
    Renderer,
    chat_completion,
    completion,
    failure,
    stream_end,
)
from producer.openai.prompt_scores import PromptView, completion_view
from producer.openai.requests import Origin, chat_request, completion_request
from producer.openai.responses import ChatCompletion, Completion, ModelCard, ModelList
from producer.openai.schemas import ChatCompletionRequest, CompletionRequest
from producer.requests import choice_requests
from producer.streams.entries import Entry
from shared.chat import ChatFeatures
from shared.errors import TokenqError
from shared.loras import list_loras_async
from shared.models import FinalEvent, GenerationRequest

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["openai"])
REQUEST_ID_HEADER = "x-tokenq-request-id"
CLIENT_CLOSED = 499  # nginx's code: the client left before the answer
# A worker refuses a request it cannot run as it claims it; a stream waits up to this
# long for its first event before it starts, so such a refusal still answers 400.
REFUSAL_WAIT_S = 0.5


def _streamed(chunk: str) -> dict[int | str, dict[str, object]]:
    """The stream=true answer: in OpenAPI 3.1 an event stream's schema is one event's."""
    data = {"type": "string", "description": f"a {chunk} as JSON; [DONE] ends the stream"}
    event = {"type": "object", "required": ["data"], "properties": {"data": data}}
    doc = f"the completion, or with stream: true {chunk}s as SSE"
    return {200: {"content": {"text/event-stream": {"schema": event}}, "description": doc}}


ERRORS = error_responses(400, 401, 403, 404, 409, 429, 500, 503, 504)
Whole = Callable[[list[FinalEvent]], BaseModel]


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    dependencies=[TRACEPARENT],
    responses={**_streamed("ChatCompletionChunk"), **ERRORS},
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, caller: Caller, backend: BackendDep
) -> Response:
    """Generate a chat reply (OpenAI-compatible; tokenq fields as extra body fields)."""
    features = await chat_features(backend, body.model)
    plan = chat_request(body, origin(caller, body.priority), features)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    model = plan.requests[0].model
    view = PromptView(vllm_top=body.prompt_logprobs)
    renderers = [
        Renderer("chat", "", model, include_usage, i, plan.tools, plan.reasoning, prompt=view)
        for i in range(body.n)
    ]
    whole: Whole = lambda finals: chat_completion(renderers, finals, body.logprobs)  # noqa: E731
    return await _answer(request, backend, caller, plan.requests, body.stream, renderers, whole)


async def chat_features(backend: Backend, model: str) -> ChatFeatures | None:
    """What the chat template of ``model`` (or of an adapter's base) does, as its live
    workers registered it; None when no live worker says."""
    live = await backend.registry.live()
    found = live.get(model) or live.get(model.rsplit(":", 1)[0])
    return None if found is None else found.chat


@router.post(
    "/completions",
    response_model=Completion,
    responses={**_streamed("Completion"), **ERRORS},
    dependencies=[TRACEPARENT],
)
async def completions(
    body: CompletionRequest, request: Request, caller: Caller, backend: BackendDep
) -> Response:
    """Continue a prompt, or each of a list of prompts (texts or token ids), n times each
    (OpenAI-compatible; choice ``p * n + i`` is prompt p's i-th)."""
    prompts = completion_request(body, origin(caller, body.priority))
    gens = [gen for prompt in prompts for gen in choice_requests(prompt, body.n)]
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    views = [completion_view(body, gen.prompt) for gen in gens]
    renderers = [
        Renderer("text", "", gens[0].model, include_usage, i, prompt_index=i // body.n, prompt=v)
        for i, v in enumerate(views)
    ]
    want_logprobs = body.logprobs is not None
    whole: Whole = lambda finals: completion(renderers, finals, want_logprobs)  # noqa: E731
    return await _answer(request, backend, caller, gens, body.stream, renderers, whole)


def origin(caller: Principal, asked: int | str | None) -> Origin:
    """The priority the caller's body asks for, checked against its key."""
    return Origin(priority_for(caller, asked))


@router.get("/models", response_model=ModelList, responses=error_responses(401, 503))
async def list_models(_: Caller, backend: BackendDep) -> ModelList:
    """The models that live workers serve now, and their LoRA adapters (``base:adapter``)."""
    return ModelList(data=await _cards(backend))


@router.get(
    "/models/{model:path}", response_model=ModelCard, responses=error_responses(401, 404, 503)
)
async def get_model(model: str, _: Caller, backend: BackendDep) -> ModelCard:
    for card in await _cards(backend):
        if card.id == model:
            return card
    raise model_not_found(model)


async def _cards(backend: Backend) -> list[ModelCard]:
    live = await backend.registry.live()
    adapters = await list_loras_async(backend.redis, backend.keys, sorted(live))
    cards = []
    for name in sorted(live):
        base = live[name]
        cards.append(ModelCard(id=name, created=base.created_s, num_workers=base.num_workers))
        cards.extend(
            ModelCard(
                id=f"{name}:{a.name}",
                created=a.registered_ms // 1000,
                num_workers=base.num_workers,
                parent=name,
            )
            for a in adapters.get(name, [])
        )
    return cards


async def _answer(
    request: Request,
    backend: Backend,
    caller: Principal,
    gens: list[GenerationRequest],
    stream: bool,
    renderers: list[Renderer],
    whole: Whole,
) -> Response:
    submitted = await submit_all(backend, gens, renderers[0].kind, caller)
    for renderer in renderers:
        renderer.request_id = submitted[0].request_id
    headers = {REQUEST_ID_HEADER: ",".join(s.request_id for s in submitted)}
    headers.update(submitted[-1].rate_headers)
    if stream:
        return await _stream_unless_refused(backend, submitted, renderers, headers)
    collect = asyncio.gather(
        *(_collect(backend, s, r) for s, r in zip(submitted, renderers, strict=True))
    )
    finals = await unless_disconnected(request, _gathered(collect))
    if finals is None:
        await _client_left(backend, submitted, renderers[0].kind)
        return Response(status_code=CLIENT_CLOSED)
    for final in finals:
        if (error := failure(final, renderers[0].kind)) is not None:
            raise error
    body = orjson.dumps(whole(finals).model_dump(mode="json"))
    return Response(body, media_type="application/json", headers=headers)


async def _gathered(work: Awaitable[list[FinalEvent]]) -> list[FinalEvent]:
    return await work


async def submit_all(
    backend: Backend, gens: list[GenerationRequest], kind: str, caller: Principal
) -> list[Submitted]:
    """One request per choice; when one is refused, the ones before it are cancelled."""
    submitted: list[Submitted] = []
    try:
        for gen in gens:
            gen = await backend.with_adapter(gen)
            submitted.append(await backend.submit(gen, api=kind, caller=caller))
    except BaseException:
        await cancel_all(backend, submitted)
        raise
    return submitted


async def _collect(backend: Backend, submitted: Submitted, renderer: Renderer) -> FinalEvent:
    final = await backend.final(submitted.request_id, renderer.add)
    backend.finished(submitted, final)
    return final


@dataclass
class Head:
    """One request's events, the first batch awaited (or awaiting) apart."""

    events: AsyncIterator[list[Entry]]
    first: asyncio.Future[list[Entry]]

    async def batches(self) -> AsyncIterator[list[Entry]]:
        try:
            yield await self.first
            async for batch in self.events:
                yield batch
        except StopAsyncIteration:
            return
        finally:
            await self.close()

    async def close(self) -> None:
        self.first.cancel()
        await self.events.aclose()  # type: ignore[attr-defined]


async def _stream_unless_refused(
    backend: Backend, submitted: list[Submitted], renderers: list[Renderer], headers: dict[str, str]
) -> Response:
    """The stream; or, when the worker refuses the request before its first event (it
    does so as it claims it: a prompt past the context, a grammar that does not compile),
    the 400 a whole answer gets, as the stream has not started."""
    if len(submitted) > 1:
        return _stream(backend, submitted, renderers, headers)
    events = backend.events(submitted[0].request_id)
    head = Head(events, asyncio.ensure_future(anext(events)))
    await asyncio.wait({head.first}, timeout=REFUSAL_WAIT_S)
    first = head.first
    if first.done() and not first.cancelled() and first.exception() is None:
        final = next((e.final() for e in first.result() if e.is_final), None)
        error = None if final is None else failure(final, renderers[0].kind)
        if final is not None and error is not None and error.status == 400:
            await head.close()
            backend.finished(submitted[0], final)
            raise error
    return _stream(backend, submitted, renderers, headers, head)


async def _merged(
    backend: Backend, submitted: list[Submitted], head: Head | None = None
) -> AsyncIterator[tuple[int, list[Entry]]]:
    """Every choice's event batches as they come, tagged with the choice's index."""
    if len(submitted) == 1:
        batches = backend.events(submitted[0].request_id) if head is None else head.batches()
        async for batch in batches:
            yield 0, batch
        return
    queue: asyncio.Queue[tuple[int, list[Entry] | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, request_id: str) -> None:
        try:
            async for batch in backend.events(request_id):
                await queue.put((index, batch))
            await queue.put((index, None))
        except Exception as e:
            await queue.put((index, e))

    tasks = [asyncio.create_task(pump(i, s.request_id)) for i, s in enumerate(submitted)]
    try:
        num_open = len(tasks)
        while num_open:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                num_open -= 1
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _stream(
    backend: Backend,
    submitted: list[Submitted],
    renderers: list[Renderer],
    headers: dict[str, str],
    head: Head | None = None,
) -> SSEResponse:
    kind = renderers[0].kind
    finals: dict[int, FinalEvent] = {}
    failed = False

    async def body() -> AsyncIterator[bytes]:
        nonlocal failed
        backend.metrics.streams.labels(kind).inc()
        try:
            yield b"".join(r.first_chunk() for r in renderers)
            async for index, batch in _merged(backend, submitted, head):
                chunks, final = renderers[index].render(batch)
                if final is not None:
                    finals[index] = final
                    backend.finished(submitted[index], final)
                if len(finals) == len(renderers):
                    ordered = [finals[i] for i in range(len(renderers))]
                    yield chunks + stream_end(renderers, ordered)
                    return
                yield chunks or KEEPALIVE
        except (TokenqError, redis.RedisError) as e:
            failed = True
            yield renderers[0].error_chunk(map_tokenq_error(e).detail)
        finally:
            backend.metrics.streams.labels(kind).dec()

    async def on_disconnect() -> None:
        running = [s for i, s in enumerate(submitted) if i not in finals]
        if running and not failed:
            await _client_left(backend, running, kind)

    return SSEResponse(body(), headers=headers, on_disconnect=on_disconnect)


async def _client_left(backend: Backend, submitted: list[Submitted], kind: str) -> None:
    """An OpenAI caller cannot resume, so its requests (one per choice) are cancelled to
    free the worker's slots; unless one was an idempotent repeat, which belongs to the
    first caller."""
    backend.metrics.disconnects.labels(kind).inc()
    await cancel_all(backend, submitted)


async def cancel_all(backend: Backend, submitted: list[Submitted]) -> None:
    for item in submitted:
        if item.duplicate:
            continue
        try:
            outcome = await backend.cancel(item.request_id)
            log.info("client left: cancel of %s %s", item.request_id, outcome)
        except (TokenqError, redis.RedisError) as e:
            log.warning("client left; could not cancel %s: %s", item.request_id, e)
