"""OpenAI's Responses API: create (foreground, streamed or background), retrieve (or
resume its event stream after a sequence number), cancel, delete, and list input items.

A response is a tokenq request: it queues by priority, runs on any worker, resumes on
another if its worker dies, and is read, streamed and cancelled from any gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Query, Request, Response

from producer.gateway.auth import Caller, Principal
from producer.gateway.backend import Backend, BackendDep, Submitted
from producer.gateway.errors import ApiError, error_responses, invalid
from producer.gateway.openai_routes import (
    CLIENT_CLOSED,
    REQUEST_ID_HEADER,
    cancel_all,
    chat_features,
    origin,
)
from producer.gateway.responses_stream import API, collected, event_stream
from producer.gateway.sse import unless_disconnected
from producer.gateway.tracing import TRACEPARENT
from producer.refusals import refusal_of
from producer.responses import store
from producer.responses.events import build
from producer.responses.inputs import Item
from producer.responses.models import DeletedResponse, InputItemList, ResponseObject
from producer.responses.objects import PARAM_NAMES
from producer.responses.plan import response_plan
from producer.responses.record import StoredResponse, request_id_of
from producer.responses.schemas import ResponsesBody
from shared.models import RequestState

router = APIRouter(prefix="/v1/responses", tags=["openai"])
ERRORS = error_responses(400, 401, 403, 404, 409, 429, 503)
CANCEL_WAIT_S = 5.0  # how long a cancel waits for a running response to stop
# With stream=true: the events as SSE (in OpenAPI 3.1 an event stream's schema is one
# event's); each event's JSON has its type and sequence_number.
STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "required": ["data", "event"],
                    "properties": {
                        "event": {"type": "string", "description": "the event's type"},
                        "data": {"type": "string", "description": "the event as JSON"},
                    },
                }
            }
        },
        "description": "the response, or with stream: true its events as SSE",
    }
}


def _json(body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


@router.post(
    "",
    response_model=ResponseObject,
    responses={**STREAMED, **ERRORS},
    dependencies=[TRACEPARENT],
)
async def create_response(
    body: ResponsesBody, request: Request, caller: Caller, backend: BackendDep
) -> Response:
    """Create a response (OpenAI-compatible; tokenq's priority, deadline and
    idempotency_key as extra fields). ``background: true`` answers at once, queued."""
    context = await _conversation(backend, body.previous_response_id, caller)
    features = await chat_features(backend, body.model)
    plan = response_plan(body, origin(caller, body.priority), features, context)
    request_gen = await backend.with_adapter(plan.request)
    submitted = await backend.submit(request_gen, api=API, caller=caller)
    record = await _stored(
        backend, plan.record.stored(submitted.request_id, time.time()), submitted
    )
    headers = {REQUEST_ID_HEADER: submitted.request_id, **submitted.rate_headers}
    if body.stream:
        return event_stream(backend, record, submitted=submitted, headers=headers)
    if record.background:
        _, builder = build(record, [])
        return _json(builder.snapshot(queued=True), headers)
    entries = await unless_disconnected(request, collected(backend, submitted.request_id))
    if entries is None:
        backend.metrics.disconnects.labels(API).inc()
        await cancel_all(backend, [submitted])
        return Response(status_code=CLIENT_CLOSED)
    _, builder = build(record, entries)
    if builder.final is not None and not submitted.duplicate:
        backend.metrics.finished(submitted.request.model, submitted.request.priority, builder.final)
    if builder.final is not None and (refusal := refusal_of(builder.final)) is not None:
        raise invalid(refusal.message, refusal.param_in(PARAM_NAMES), refusal.code)
    return _json(builder.snapshot(), headers)


async def _stored(backend: Backend, record: StoredResponse, submitted: Submitted) -> StoredResponse:
    """The record as kept (the first one, for a repeated idempotency key); a request
    whose record could not be kept is cancelled, as no one could read its answer."""
    if not record.store:
        return record
    try:
        return await store.save(backend.redis, backend.keys, record)
    except BaseException:
        await cancel_all(backend, [submitted])
        raise


async def _conversation(backend: Backend, previous: str | None, caller: Principal) -> list[Item]:
    """The items a response continuing ``previous`` starts from: its conversation, and
    its output once it has ended."""
    if previous is None:
        return []
    request_id = request_id_of(previous, "previous_response_id")
    try:
        view = await store.read(backend.redis, backend.keys, request_id, caller.scope)
    except ApiError as e:
        raise store.not_found(previous, "previous_response_id") from e
    _, builder = build(view.record, view.entries)
    if builder.final is None:
        raise invalid(
            f"previous_response_id: response {previous} has not ended yet; wait for it "
            f"(GET /v1/responses/{previous}) before continuing it",
            "previous_response_id",
        )
    return view.record.conversation(builder.output)


@router.get("/{response_id}", response_model=ResponseObject, responses={**STREAMED, **ERRORS})
async def retrieve_response(
    response_id: str,
    caller: Caller,
    backend: BackendDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """The response now (queued, in_progress, completed, incomplete, failed or cancelled);
    with ``stream=true`` its events, from the start or after ``starting_after``, live
    while it runs."""
    view = await _view(backend, response_id, caller)
    if stream:
        after = -1 if starting_after is None else starting_after
        return event_stream(backend, view.record, after)
    _, builder = build(view.record, view.entries)
    return _json(builder.snapshot(queued=view.state is RequestState.QUEUED))


@router.post("/{response_id}/cancel", response_model=ResponseObject, responses=ERRORS)
async def cancel_response(response_id: str, caller: Caller, backend: BackendDep) -> Response:
    """Cancel a background response: a queued one ends at once, a running one within a
    step or two (waited for up to a few seconds). An ended one is answered as it is."""
    view = await _view(backend, response_id, caller)
    if not view.record.background:
        raise invalid(
            "only a response created with background: true can be cancelled; a foreground "
            "response is cancelled by closing its connection",
            "response_id",
        )
    entries = view.entries
    if not (entries and entries[-1].is_final):
        await backend.cancel(view.record.request_id)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CANCEL_WAIT_S):
                entries = entries + await collected(backend, view.record.request_id, view.last_id)
    _, builder = build(view.record, entries)
    return _json(builder.snapshot(queued=view.state is RequestState.QUEUED))


@router.delete("/{response_id}", response_model=DeletedResponse, responses=ERRORS)
async def delete_response(response_id: str, caller: Caller, backend: BackendDep) -> Response:
    """Delete a stored response (one still running is cancelled)."""
    view = await _view(backend, response_id, caller)
    if not view.state.terminal:
        await backend.cancel(view.record.request_id)
    await store.delete(backend.redis, backend.keys, view.record.request_id)
    return _json({"id": view.record.id, "object": "response", "deleted": True})


@router.get("/{response_id}/input_items", response_model=InputItemList, responses=ERRORS)
async def list_input_items(
    response_id: str,
    caller: Caller,
    backend: BackendDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> Response:
    """The response's input items (this response's own, not its previous_response_id's),
    newest first unless ``order=asc``; page with ``after`` (an item id) and ``limit``."""
    view = await _view(backend, response_id, caller)
    items = view.record.input if order == "asc" else view.record.input[::-1]
    start = _start_after(items, after)
    page = items[start : start + limit]
    return _json(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + limit < len(items),
        }
    )


def _start_after(items: list[Item], after: str | None) -> int:
    if after is None:
        return 0
    for n, item in enumerate(items):
        if item.get("id") == after:
            return n + 1
    raise invalid(f"after: no input item {after!r} in this response", "after")


async def _view(backend: Backend, value: str, caller: Principal) -> store.View:
    return await store.read(backend.redis, backend.keys, request_id_of(value), caller.scope)
