"""Files on the batches' Redis: a hash per file (its object and owner), its bytes in
chunks in a list beside it, and a sorted set of each tenant's files for listing.

Chunks keep every command that moves a file's bytes small, so a large upload or
download never holds Redis for long. A file expires with its keys; a listing drops
the ids of files that have expired from the tenant's index as it meets them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import redis

from producer.files.models import FileObject
from producer.paging import Page, page
from shared.errors import NotFound
from shared.keys import FileKeys, is_file_id, new_file_id
from shared.replies import text
from shared.settings import Settings

CHUNK_BYTES = 1024 * 1024
NO_TENANT = "default"  # the owner of what an open gateway or the CLI creates


@dataclass(frozen=True)
class Upload:
    """A file to store: its bytes, name, purpose, owner and lifetime."""

    data: bytes
    filename: str
    purpose: str  # one of UPLOAD_PURPOSES
    tenant: str
    expires_after_s: int | None = None


class FileStore:
    def __init__(self, r: redis.Redis, settings: Settings) -> None:
        self.redis, self.settings = r, settings
        self.keys = FileKeys(settings.namespace)

    def create(self, upload: Upload) -> FileObject:
        file_id, created_ms = new_file_id(), _now_ms(self.redis)
        ttl_s = upload.expires_after_s or self.settings.files_ttl_s
        expires_ms = created_ms + ttl_s * 1000
        meta = {
            "filename": upload.filename,
            "purpose": upload.purpose,
            "bytes": len(upload.data),
            "created_ms": created_ms,
            "expires_ms": expires_ms,
            "tenant": upload.tenant,
        }
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.meta(file_id), mapping=meta)  # type: ignore[arg-type]
            for start in range(0, len(upload.data), CHUNK_BYTES):
                pipe.rpush(self.keys.data(file_id), upload.data[start : start + CHUNK_BYTES])
            self._index(pipe, file_id, upload.tenant, created_ms, expires_ms)
            pipe.execute()
        return self.get(file_id)

    def record(self, file_id: str, meta: Mapping[str, str | int], expires_ms: int) -> None:
        """Write a file's record whose bytes live elsewhere (a batch's output); the
        same again changes nothing."""
        fields: dict[str, str | int] = {**meta, "expires_ms": expires_ms}
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.meta(file_id), mapping=fields)  # type: ignore[arg-type]
            tenant, created_ms = str(meta["tenant"]), int(meta["created_ms"])
            self._index(pipe, file_id, tenant, created_ms, expires_ms)
            pipe.execute()

    def _index(
        self,
        pipe: redis.client.Pipeline,
        file_id: str,
        tenant: str,
        created_ms: int,
        expires_ms: int,
    ) -> None:
        for key in (self.keys.meta(file_id), self.keys.data(file_id)):
            pipe.pexpireat(key, expires_ms)
        pipe.zadd(self.keys.owned(tenant), {file_id: created_ms})

    def meta(self, file_id: str, scope: str | None = None) -> dict[str, str]:
        """The file's record; NotFound if it is gone or, with a ``scope`` (a tenant),
        another tenant's."""
        raw = self.redis.hgetall(self.keys.meta(file_id)) if is_file_id(file_id) else {}
        m = {text(k): text(v) for k, v in raw.items()}
        if not m or (scope is not None and m["tenant"] != scope):
            raise NotFound(f"no such file: {file_id!r} (it was deleted, expired or never made)")
        return m

    def get(self, file_id: str, scope: str | None = None) -> FileObject:
        return file_object(file_id, self.meta(file_id, scope))

    def chunks(self, file_id: str) -> Iterator[bytes]:
        """The stored bytes of an uploaded file, chunk by chunk."""
        for at in range(self.redis.llen(self.keys.data(file_id))):
            chunk = self.redis.lindex(self.keys.data(file_id), at)
            if chunk is None:
                raise NotFound(f"file {file_id!r} expired while it was read")
            yield chunk if isinstance(chunk, bytes) else chunk.encode()

    def read(self, file_id: str) -> bytes:
        return b"".join(self.chunks(file_id))

    def delete(self, file_id: str, scope: str | None = None) -> None:
        tenant = self.meta(file_id, scope)["tenant"]
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.meta(file_id), self.keys.data(file_id))
            pipe.zrem(self.keys.owned(tenant), file_id)
            pipe.execute()

    def list_files(
        self, tenant: str, *, purpose: str | None, after: str | None, limit: int, newest_first: bool
    ) -> Page[FileObject]:
        def load(ids: Sequence[str]) -> list[FileObject]:
            return self._load(tenant, ids, purpose)

        index = self.keys.owned(tenant)
        return page(self.redis, index, load, after=after, limit=limit, newest_first=newest_first)

    def _load(self, tenant: str, ids: Sequence[str], purpose: str | None) -> list[FileObject]:
        pipe = self.redis.pipeline(transaction=False)
        for file_id in ids:
            pipe.hgetall(self.keys.meta(file_id))
        found, gone = [], []
        for file_id, raw in zip(ids, pipe.execute(), strict=True):
            if not raw:
                gone.append(file_id)
                continue
            f = file_object(file_id, {text(k): text(v) for k, v in raw.items()})
            if purpose is None or f.purpose == purpose:
                found.append(f)
        if gone:
            self.redis.zrem(self.keys.owned(tenant), *gone)
        return found


def file_object(file_id: str, m: Mapping[str, str]) -> FileObject:
    return FileObject(
        id=file_id,
        bytes=int(m["bytes"]),
        created_at=int(m["created_ms"]) // 1000,
        expires_at=int(m["expires_ms"]) // 1000,
        filename=m["filename"],
        purpose=m["purpose"],
    )


def _now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000
