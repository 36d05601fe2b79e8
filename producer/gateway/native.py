"""tokenq's own routes: submit with a priority, read status and result, follow or resume
a request's events, cancel. Native streams do not cancel on disconnect: they resume."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Literal

import redis
from fastapi import APIRouter, Header, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from producer.gateway.auth import Caller, Principal, priority_for
from producer.gateway.backend import Backend, BackendDep
from producer.gateway.errors import (
    ErrorDetail,
    ErrorResponse,
    error_responses,
    from_validation_errors,
    invalid,
    map_tokenq_error,
)
from producer.gateway.hub import parse_cursor
from producer.gateway.refused import NATIVE_NAMES
from producer.gateway.sse import KEEPALIVE, SSEResponse, frame
from producer.gateway.tracing import TRACEPARENT
from producer.openai.requests import deadline_ms
from producer.openai.schemas import CACHE_SALT_DOC, PRIORITY_DOC
from producer.refusals import refusal_of
from shared.errors import TokenqError
from shared.keys import REQUEST_ID_RE
from shared.models import (
    MAX_CACHE_SALT_CHARS,
    ChatMessage,
    FinishReason,
    GenerationRequest,
    MetadataValue,
    RequestState,
    RequestStatus,
    Result,
    SamplingParams,
)
from shared.settings import Settings

router = APIRouter(prefix="/v1/requests", tags=["native"])
STREAM_ID = r"^[0-9]{1,20}-[0-9]{1,20}$"
# One server-sent event (an event stream's schema, in OpenAPI 3.1, is one event's).
EVENT_SCHEMA = {
    "type": "object",
    "required": ["data", "event"],
    "properties": {
        "id": {"type": "string", "pattern": STREAM_ID, "description": "the Redis Stream id"},
        "event": {"enum": ["token", "final", "error"]},
        "data": {"type": "string", "description": "the TokenEvent, FinalEvent or error as JSON"},
    },
}
RequestId = Annotated[str, Path(pattern=REQUEST_ID_RE.pattern, description="a request id")]


class SubmitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="default: the deployment's default model")
    lora: str | None = Field(None, description="a LoRA adapter registered for the model")
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    priority: int | str | None = Field(None, description=PRIORITY_DOC)
    sampling: SamplingParams = SamplingParams()
    deadline: float | None = Field(None, description="seconds from now to finish by")
    idempotency_key: str | None = None
    metadata: dict[str, MetadataValue] = Field(default_factory=dict)
    cache_salt: str | None = Field(
        None, description=CACHE_SALT_DOC, json_schema_extra={"maxLength": MAX_CACHE_SALT_CHARS}
    )


class SubmitReply(BaseModel):
    id: str
    model: str
    priority: int
    state: RequestState
    position: int | None = Field(description="requests ahead of it while queued")
    duplicate: bool = Field(description="the idempotency key matched this earlier request")


class RequestView(RequestStatus):
    result: Result | None = None
    error: ErrorDetail | None = Field(
        None,
        description="why a failed request failed: invalid_request_error (naming the "
        "field) for a request that could not run as asked, else server_error",
    )


class CancelReply(BaseModel):
    id: str
    outcome: Literal["cancelled", "requested", "done"] = Field(
        description="cancelled: was queued; requested: running, its worker stops it; "
        "done: it had ended"
    )


@router.post(
    "",
    status_code=202,
    response_model=SubmitReply,
    dependencies=[TRACEPARENT],
    responses={
        200: {"model": SubmitReply, "description": "an idempotent repeat"},
        **error_responses(400, 401, 403, 404, 409, 429, 503),
    },
)
async def submit(
    body: SubmitBody, caller: Caller, backend: BackendDep, response: Response
) -> SubmitReply:
    """Queue a request; 202 with its id (200 with the earlier id for a repeated idempotency key)."""
    submitted = await backend.submit(
        _request(body, caller, backend.settings), api="native", caller=caller
    )
    status = await backend.status(submitted.request_id)
    response.headers.update(submitted.rate_headers)
    if submitted.duplicate:
        response.status_code = 200
    return SubmitReply(
        id=status.id,
        model=status.model,
        priority=status.priority,
        state=status.state,
        position=status.position,
        duplicate=submitted.duplicate,
    )


@router.get(
    "/{request_id}", response_model=RequestView, responses=error_responses(400, 401, 404, 503)
)
async def get_request(request_id: RequestId, caller: Caller, backend: BackendDep) -> RequestView:
    """State, queue position and, once it has ended, the result."""
    status, result = await backend.view(request_id, caller.scope)
    return RequestView(**status.model_dump(), result=result, error=_error_of(result))


def _error_of(result: Result | None) -> ErrorDetail | None:
    if result is None or result.finish_reason is not FinishReason.ERROR:
        return None
    refusal = refusal_of(result)
    if refusal is None:
        return ErrorDetail(message=result.error or "failed", type="server_error")
    param = refusal.param_in(NATIVE_NAMES)
    return ErrorDetail(
        message=refusal.message, type="invalid_request_error", param=param, code=refusal.code
    )


@router.delete(
    "/{request_id}", response_model=CancelReply, responses=error_responses(400, 401, 404, 503)
)
async def cancel(request_id: RequestId, caller: Caller, backend: BackendDep) -> CancelReply:
    """Cancel: a queued request ends at once, a running one within one engine step."""
    outcome = await backend.cancel(request_id, caller.scope)
    return CancelReply(id=request_id, outcome=outcome)


@router.get(
    "/{request_id}/events",
    response_model=None,
    dependencies=[TRACEPARENT],
    responses={
        200: {
            "content": {"text/event-stream": {"schema": EVENT_SCHEMA}},
            "description": "token events, then one final event",
        },
        **error_responses(400, 401, 404, 503),
    },
)
async def events(
    request_id: RequestId,
    caller: Caller,
    backend: BackendDep,
    after: Annotated[str | None, Query(pattern=STREAM_ID, description="resume after it")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", pattern=STREAM_ID)] = None,
) -> SSEResponse:
    """The request's events as SSE: ``id`` is the Redis Stream id, ``event`` is token or
    final (or error). Reconnect with ``Last-Event-ID`` (or ``?after=``) to resume."""
    cursor = _cursor(last_event_id, after)
    await backend.status(request_id, caller.scope)  # 404 before the stream starts
    return SSEResponse(_event_frames(backend, request_id, cursor))


def _cursor(last_event_id: str | None, after: str | None) -> str:
    """Where to resume: Last-Event-ID (what an EventSource sends) wins over ?after=."""
    param, value = ("header.Last-Event-ID", last_event_id) if last_event_id else ("after", after)
    if value is None:
        return "0-0"
    try:
        parse_cursor(value)
    except ValueError as e:
        raise invalid(f"invalid request: {param}: {e}", param) from e
    return value


async def _event_frames(backend: Backend, request_id: str, cursor: str) -> AsyncIterator[bytes]:
    try:
        async for batch in backend.events(request_id, cursor):
            yield b"".join(frame(e.data, event_id=e.id, event=e.type) for e in batch) or KEEPALIVE
    except (TokenqError, redis.RedisError) as e:
        body = ErrorResponse(error=map_tokenq_error(e).detail).model_dump_json()
        yield frame(body, event="error")


def _request(body: SubmitBody, caller: Principal, settings: Settings) -> GenerationRequest:
    data = {
        "model": body.model or settings.default_model,
        "lora": body.lora,
        "prompt": body.prompt,
        "messages": body.messages,
        "priority": priority_for(caller, body.priority),
        "sampling": body.sampling,
        "deadline_ms": deadline_ms(body.deadline),
        "idempotency_key": body.idempotency_key,
        "metadata": body.metadata,
        "cache_salt": body.cache_salt,
    }
    try:
        return GenerationRequest.model_validate(data)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from e
