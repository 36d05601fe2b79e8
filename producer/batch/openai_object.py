"""The batch object and its list as OpenAI's Batch API shows them, from a BatchStatus;
``priority``, ``tenant`` and ``webhook_url`` are tokenq's additions."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from producer.batch.models import BatchState, BatchStatus
from producer.paging import Page


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchError(BaseModel):
    code: str | None = None
    message: str | None = None
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class OpenAIBatch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str | None
    errors: BatchErrors | None = None
    input_file_id: str | None
    completion_window: str
    status: BatchState
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None
    priority: int
    tenant: str | None = None
    webhook_url: str | None = None


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIBatch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool


# The timestamp that says when a batch reached each end.
ENDED_AT = {
    BatchState.COMPLETED: "completed_at",
    BatchState.FAILED: "failed_at",
    BatchState.EXPIRED: "expired_at",
    BatchState.CANCELLED: "cancelled_at",
}


def openai_batch(s: BatchStatus) -> OpenAIBatch:
    ended = {ENDED_AT[s.state]: _s(s.finished_ms)} if s.state in ENDED_AT else {}
    counts = RequestCounts(
        total=s.counts.total, completed=s.counts.completed, failed=s.counts.failed
    )
    return OpenAIBatch(
        id=s.id,
        endpoint=s.endpoint,
        errors=_errors(s),
        input_file_id=s.input_file_id,
        completion_window=s.completion_window,
        status=s.state,
        output_file_id=s.output_file_id,
        error_file_id=s.error_file_id,
        created_at=s.created_ms // 1000,
        in_progress_at=s.created_ms // 1000,  # validated as it was made
        expires_at=_s(s.expires_ms),
        finalizing_at=_s(s.finalizing_ms),
        cancelling_at=_s(s.cancelling_ms),
        request_counts=counts,
        metadata=s.metadata,
        priority=s.priority,
        tenant=s.tenant,
        webhook_url=s.webhook_url,
        **ended,
    )


def batch_list(found: Page[BatchStatus]) -> BatchList:
    data = [openai_batch(s) for s in found.items]
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return BatchList(data=data, first_id=first, last_id=last, has_more=found.has_more)


def _errors(s: BatchStatus) -> BatchErrors | None:
    """What is keeping the batch from going on (its driver's last error, while RQ retries)."""
    if s.error is None:
        return None
    return BatchErrors(data=[BatchError(code="driver_error", message=s.error)])


def _s(ms: int | None) -> int | None:
    return None if ms is None else ms // 1000
