"""What a batch looks like to its users: its state and progress."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class BatchState(StrEnum):
    IN_PROGRESS = "in_progress"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (BatchState.COMPLETED, BatchState.CANCELLED, BatchState.FAILED)


class BatchCounts(BaseModel):
    model_config = ConfigDict(frozen=True)

    total: int
    completed: int = 0
    failed: int = 0
    in_flight: int = 0

    @property
    def done(self) -> int:
        return self.completed + self.failed


class BatchStatus(BaseModel):
    """A batch as stored in Redis (``tokenq batch status``)."""

    model_config = ConfigDict(frozen=True)

    id: str
    state: BatchState
    priority: int
    counts: BatchCounts
    submitted: int
    created_ms: int
    finished_ms: int | None = None
    webhook_url: str | None = None
    error: str | None = None
    tenant: str | None = Field(None, description="who created it (a gateway's API key)")
