"""What a batch looks like to its users: its state and progress."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class BatchState(StrEnum):
    """OpenAI's batch statuses. A batch is validated as it is made (a bad file is refused
    then), so tokenq's start in_progress; ``finalizing`` while its output files are made."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = (BatchState.COMPLETED, BatchState.CANCELLED, BatchState.EXPIRED, BatchState.FAILED)


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
    # OpenAI's batch fields (None for a batch made before they were kept).
    endpoint: str | None = None
    completion_window: str = "24h"
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    metadata: dict[str, str] | None = None
    finalizing_ms: int | None = None
    cancelling_ms: int | None = None
    expires_ms: int | None = None
