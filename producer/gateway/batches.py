"""Batches over HTTP, in the shape of OpenAI's Batch API: the same operations as
`tokenq batch` and ``producer.batch.Batches`` (which run on RQ).

A batch is made from an uploaded file (``input_file_id``, OpenAI's way) or, as a tokenq
extension, from its lines inline (``requests``), with a priority and a webhook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

import orjson
from fastapi import APIRouter, Body, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.concurrency import run_in_threadpool

from producer.batch.context import BatchRedisRequired
from producer.batch.openai_object import BatchList, OpenAIBatch, batch_list, openai_batch
from producer.batch.ops import Batches
from producer.batch.webhooks import WebhookNotConfigured
from producer.client import Client
from producer.files.store import FileStore
from producer.gateway.auth import Caller, priority_for
from producer.gateway.errors import ApiError, error_responses, invalid
from shared.errors import NotFound

router = APIRouter(prefix="/v1/batches", tags=["batches"])
T = TypeVar("T")
JSONL = "application/jsonl"
Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
Metadata = dict[
    Annotated[str, StringConstraints(max_length=64)],
    Annotated[str, StringConstraints(max_length=512)],
]
MAX_LIST_LIMIT = 100


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str | None = Field(None, description="an uploaded file (purpose batch)")
    endpoint: Endpoint | None = Field(None, description="what every line calls")
    completion_window: Literal["24h"] = "24h"
    metadata: Metadata | None = Field(None, max_length=16)
    requests: list[dict[str, Any]] | None = Field(
        None,
        min_length=1,
        description="tokenq's inline form, instead of input_file_id: lines of OpenAI's "
        "batch format, each with a custom_id",
    )
    priority: int | str = "low"
    model: str | None = Field(None, description="for lines whose body names no model")
    webhook_url: str | None = Field(None, description="POSTed, signed, when the batch ends")


def _batches(request: Request) -> Batches:
    """One synchronous Batches per app (RQ is synchronous), made on first use."""
    state = request.app.state
    if getattr(state, "batches", None) is None:
        client = Client(settings=state.backend.settings)
        try:
            state.batches = Batches(client)
        except BatchRedisRequired as e:
            client.close()
            raise ApiError(503, str(e), type="service_unavailable", code="batches_off") from e
    batches: Batches = state.batches
    return batches


BatchesDep = Annotated[Batches, Depends(_batches)]


async def _run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return await run_in_threadpool(fn, *args, **kwargs)
    except WebhookNotConfigured as e:
        raise ApiError(503, str(e), type="service_unavailable", code="webhooks_off") from e


@router.post("", response_model=OpenAIBatch, responses=error_responses(400, 401, 403, 404, 503))
async def create_batch(
    body: Annotated[BatchCreate, Body()], batches: BatchesDep, caller: Caller
) -> OpenAIBatch:
    """Create a batch; its lines run at the batch's priority without flooding the queue."""
    priority = priority_for(caller, body.priority)
    source = await _run(_source, batches, body, caller.scope)
    details: dict[str, str] = {"completion_window": body.completion_window}
    if body.input_file_id is not None:
        details["input_file_id"] = body.input_file_id
    if body.metadata:
        details["metadata"] = orjson.dumps(body.metadata).decode()
    batch_id = await _run(
        batches.submit,
        source,
        priority=priority,
        model=body.model,
        webhook_url=body.webhook_url,
        tenant=caller.tenant,
        endpoint=body.endpoint,
        details=details,
    )
    return openai_batch(await _run(batches.status, batch_id))


def _source(batches: Batches, body: BatchCreate, scope: str | None) -> bytes | list[dict[str, Any]]:
    """The batch's lines: the input file's bytes, or the inline requests."""
    file_id = body.input_file_id
    if (file_id is None) == (body.requests is None):
        raise invalid("give input_file_id (an uploaded batch file) or requests (inline lines)")
    if file_id is None:
        return body.requests or []
    if body.endpoint is None:
        raise invalid("endpoint: give the endpoint every line of the file calls", "endpoint")
    files = FileStore(batches.ctx.redis, batches.ctx.settings)
    try:
        purpose = files.meta(file_id, scope)["purpose"]
    except NotFound as e:
        message = f"input_file_id: no such file {file_id!r}"
        raise ApiError(
            404, message, type="not_found_error", param="input_file_id", code="file_not_found"
        ) from e
    if purpose != "batch":
        message = f"input_file_id: {file_id} has purpose {purpose!r}; upload it with purpose batch"
        raise invalid(message, "input_file_id")
    return files.read(file_id)


@router.get("", response_model=BatchList, responses=error_responses(400, 401))
async def list_batches(
    batches: BatchesDep,
    caller: Caller,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = 20,
) -> BatchList:
    """The newest batches first (with API keys, the caller's tenant's only)."""
    return batch_list(await _run(batches.page, limit, caller.scope, after))


@router.get("/{batch_id}", response_model=OpenAIBatch, responses=error_responses(400, 401, 404))
async def get_batch(batch_id: str, batches: BatchesDep, caller: Caller) -> OpenAIBatch:
    return openai_batch(await _run(batches.status, batch_id, caller.scope))


@router.post(
    "/{batch_id}/cancel", response_model=OpenAIBatch, responses=error_responses(400, 401, 404)
)
async def cancel_batch(batch_id: str, batches: BatchesDep, caller: Caller) -> OpenAIBatch:
    """Stop the batch: queued lines are cancelled; finished lines keep their output."""
    return openai_batch(await _run(batches.cancel, batch_id, caller.scope))


@router.get("/{batch_id}/output", response_class=Response, responses=error_responses(400, 401, 404))
async def batch_output(batch_id: str, batches: BatchesDep, caller: Caller) -> Response:
    """The output JSONL, one line per finished custom_id, in input order (so far)."""
    outputs, _errors = await _run(batches.results, batch_id, caller.scope)
    return Response(b"".join(line + b"\n" for line in outputs), media_type=JSONL)


@router.get("/{batch_id}/errors", response_class=Response, responses=error_responses(400, 401, 404))
async def batch_errors(batch_id: str, batches: BatchesDep, caller: Caller) -> Response:
    """The error JSONL, one line per failed or cancelled custom_id (so far)."""
    _outputs, errors = await _run(batches.results, batch_id, caller.scope)
    return Response(b"".join(line + b"\n" for line in errors), media_type=JSONL)
