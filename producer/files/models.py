"""The file object and its list, as OpenAI's Files API shows them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# What an upload may say it is for; ``batch_output`` files are the batches' own.
UPLOAD_PURPOSES = ("batch", "user_data")
Purpose = Literal["batch", "user_data", "batch_output"]
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 24 * 3600


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: Purpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = Field(True)
