"""A batch's output and error files: records in the file store, made as the batch ends,
whose bytes are read from the batch's results (kept once, in the batch's hashes), so
they expire with the batch."""

from __future__ import annotations

from collections.abc import Mapping

from producer.batch import store
from producer.batch.context import Context
from producer.files.store import NO_TENANT, FileStore
from shared.keys import derived_file_id

PARTS = ("output", "error")


def record(ctx: Context, batch_id: str) -> dict[str, str]:
    """Record the output and error files of a batch whose lines have all ended (each
    only if it has lines); returns ``{output_file_id, error_file_id}`` as found. The
    same again records the same files."""
    tenant = store.meta(ctx, batch_id).get("tenant") or NO_TENANT
    created_ms = store.now_ms(ctx)
    expires_ms = created_ms + ctx.settings.batch_ttl_s * 1000
    files = FileStore(ctx.redis, ctx.settings)
    ids: dict[str, str] = {}
    for part, lines in zip(PARTS, store.results(ctx, batch_id), strict=True):
        if not lines:
            continue
        file_id = derived_file_id(batch_id, part)
        meta: dict[str, str | int] = {
            "filename": f"{batch_id}_{part}.jsonl",
            "purpose": "batch_output",
            "bytes": sum(len(line) + 1 for line in lines),
            "created_ms": created_ms,
            "tenant": tenant,
            "batch_id": batch_id,
            "part": part,
        }
        files.record(file_id, meta, expires_ms)
        ids[f"{part}_file_id"] = file_id
    return ids


def content(ctx: Context, meta: Mapping[str, str]) -> bytes | None:
    """The JSONL of a batch's output or error file; None for an uploaded file."""
    batch_id = meta.get("batch_id")
    if not batch_id:
        return None
    outputs, errors = store.results(ctx, batch_id)
    lines = outputs if meta["part"] == "output" else errors
    return b"".join(line + b"\n" for line in lines)
