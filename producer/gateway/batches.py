"""Batches over HTTP, in the shape of OpenAI's Batch API: the same operations as
`tokenq batch` and ``producer.batch.Batches`` (which run on RQ)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from producer.batch.context import BatchRedisRequired
from producer.batch.models import BatchStatus
from producer.batch.ops import Batches
from producer.batch.webhooks import WebhookNotConfigured
from producer.client import Client
from producer.gateway.auth import Caller, priority_for
from producer.gateway.errors import ApiError, error_responses

router = APIRouter(prefix="/v1/batches", tags=["batches"])
T = TypeVar("T")
JSONL = "application/jsonl"


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: list[dict[str, Any]] = Field(
        min_length=1, description="lines of OpenAI's batch format, each with a custom_id"
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


@router.post(
    "", status_code=201, response_model=BatchStatus, responses=error_responses(400, 401, 403, 503)
)
async def create_batch(
    body: Annotated[BatchCreate, Body()], batches: BatchesDep, caller: Caller
) -> BatchStatus:
    """Create a batch; its lines run at the batch's priority without flooding the queue."""
    priority = priority_for(caller, body.priority)
    batch_id = await _run(
        batches.submit,
        body.requests,
        priority=priority,
        model=body.model,
        webhook_url=body.webhook_url,
        tenant=caller.tenant,
    )
    return await _run(batches.status, batch_id)


@router.get("", response_model=list[BatchStatus], responses=error_responses(400, 401))
async def list_batches(batches: BatchesDep, caller: Caller, limit: int = 50) -> list[BatchStatus]:
    """The newest batches first (with API keys, the caller's tenant's only)."""
    return await _run(batches.list, max(1, min(limit, 500)), caller.scope)


@router.get("/{batch_id}", response_model=BatchStatus, responses=error_responses(400, 401, 404))
async def get_batch(batch_id: str, batches: BatchesDep, caller: Caller) -> BatchStatus:
    return await _run(batches.status, batch_id, caller.scope)


@router.post(
    "/{batch_id}/cancel", response_model=BatchStatus, responses=error_responses(400, 401, 404)
)
async def cancel_batch(batch_id: str, batches: BatchesDep, caller: Caller) -> BatchStatus:
    """Stop the batch: queued lines are cancelled; finished lines keep their output."""
    return await _run(batches.cancel, batch_id, caller.scope)


@router.get("/{batch_id}/output", response_class=Response, responses=error_responses(400, 401, 404))
async def batch_output(batch_id: str, batches: BatchesDep, caller: Caller) -> Response:
    """The output JSONL, one line per finished custom_id, in input order."""
    outputs, _errors = await _run(batches.results, batch_id, caller.scope)
    return Response(b"".join(line + b"\n" for line in outputs), media_type=JSONL)


@router.get("/{batch_id}/errors", response_class=Response, responses=error_responses(400, 401, 404))
async def batch_errors(batch_id: str, batches: BatchesDep, caller: Caller) -> Response:
    """The error JSONL, one line per failed or cancelled custom_id."""
    _outputs, errors = await _run(batches.results, batch_id, caller.scope)
    return Response(b"".join(line + b"\n" for line in errors), media_type=JSONL)
