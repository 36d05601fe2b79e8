"""Files over HTTP, in the shape of OpenAI's Files API: upload (multipart), list,
retrieve, download, delete. Files live on the batches' Redis (``producer.files.store``)
and belong to the tenant that uploaded them; a batch's output and error files are
files too."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from producer.batch import result_files
from producer.batch.file_check import check_batch_jsonl
from producer.body_guard import PathLimit
from producer.files.models import (
    MAX_EXPIRY_S,
    MIN_EXPIRY_S,
    UPLOAD_PURPOSES,
    FileDeleted,
    FileList,
    FileObject,
)
from producer.files.store import FileStore, Upload
from producer.gateway.auth import Caller
from producer.gateway.batches import BatchesDep
from producer.gateway.errors import ApiError, error_responses, invalid
from shared.settings import Settings

router = APIRouter(prefix="/v1/files", tags=["files"])
# Room for the multipart form around the file (boundaries, headers, purpose).
FORM_SLACK_BYTES = 64 * 1024
MAX_LIST_LIMIT = 10_000
BINARY: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "the file's bytes"}
}


def too_large_message(max_bytes: int) -> str:
    return (
        f"file too large: the limit is {max_bytes} bytes (TOKENQ_FILES_MAX_BYTES); "
        "split it into smaller files"
    )


def body_limits(settings: Settings) -> dict[str, PathLimit]:
    """The upload route's body limit, for the gateway's BodyGuard."""
    limit = settings.files_max_bytes
    return {router.prefix: PathLimit(limit + FORM_SLACK_BYTES, too_large_message(limit))}


def _store(batches: BatchesDep) -> FileStore:
    return FileStore(batches.ctx.redis, batches.ctx.settings)


@router.post("", response_model=FileObject, responses=error_responses(400, 401, 413, 503))
async def upload_file(
    file: Annotated[UploadFile, File(description="the file (JSONL for purpose=batch)")],
    purpose: Annotated[str, Form(description="batch or user_data")],
    batches: BatchesDep,
    caller: Caller,
    anchor: Annotated[str | None, Form(alias="expires_after[anchor]")] = None,
    seconds: Annotated[int | None, Form(alias="expires_after[seconds]")] = None,
) -> FileObject:
    """Store a file for the caller's tenant. A batch file is checked line by line."""
    settings = batches.ctx.settings
    if purpose not in UPLOAD_PURPOSES:
        raise invalid(
            f"purpose: {purpose!r} is not one tokenq keeps files for; use batch or user_data",
            "purpose",
        )
    data = await file.read(settings.files_max_bytes + 1)
    if len(data) > settings.files_max_bytes:
        raise ApiError(
            413, too_large_message(settings.files_max_bytes), param="file", code="file_too_large"
        )
    if purpose == "batch":
        await run_in_threadpool(check_batch_jsonl, data, settings.max_batch_lines)
    upload = Upload(
        data, file.filename or "upload", purpose, caller.tenant, _expiry_s(anchor, seconds)
    )
    return await run_in_threadpool(_store(batches).create, upload)


def _expiry_s(anchor: str | None, seconds: int | None) -> int | None:
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise invalid("expires_after.anchor: must be 'created_at'", "expires_after.anchor")
    if seconds is None or not MIN_EXPIRY_S <= seconds <= MAX_EXPIRY_S:
        message = f"expires_after.seconds: give {MIN_EXPIRY_S} to {MAX_EXPIRY_S} seconds"
        raise invalid(message, "expires_after.seconds")
    return seconds


@router.get("", response_model=FileList, responses=error_responses(400, 401, 503))
async def list_files(
    batches: BatchesDep,
    caller: Caller,
    purpose: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = MAX_LIST_LIMIT,
    order: Literal["asc", "desc"] = "desc",
) -> FileList:
    """The caller's files by creation time (newest first unless order=asc)."""
    found = await run_in_threadpool(
        _store(batches).list_files,
        caller.tenant,
        purpose=purpose,
        after=after,
        limit=limit,
        newest_first=order == "desc",
    )
    data = found.items
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return FileList(data=data, first_id=first, last_id=last, has_more=found.has_more)


@router.get("/{file_id}", response_model=FileObject, responses=error_responses(401, 404, 503))
async def retrieve_file(file_id: str, batches: BatchesDep, caller: Caller) -> FileObject:
    return await run_in_threadpool(_store(batches).get, file_id, caller.scope)


@router.get(
    "/{file_id}/content",
    response_class=Response,
    responses={**BINARY, **error_responses(401, 404, 503)},
)
async def file_content(file_id: str, batches: BatchesDep, caller: Caller) -> Response:
    """The file's bytes (a batch's output or error file: its JSONL lines, in input order)."""
    return Response(
        await run_in_threadpool(_content, batches, file_id, caller.scope),
        media_type="application/octet-stream",
    )


def _content(batches: BatchesDep, file_id: str, scope: str | None) -> bytes:
    store = _store(batches)
    meta = store.meta(file_id, scope)
    made = result_files.content(batches.ctx, meta)
    return made if made is not None else store.read(file_id)


@router.delete("/{file_id}", response_model=FileDeleted, responses=error_responses(401, 404, 503))
async def delete_file(file_id: str, batches: BatchesDep, caller: Caller) -> FileDeleted:
    """Delete the file (a batch made from it keeps its own copy of the lines)."""
    await run_in_threadpool(_store(batches).delete, file_id, caller.scope)
    return FileDeleted(id=file_id)
