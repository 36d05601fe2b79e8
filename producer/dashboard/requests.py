"""Requests: the bounded lists (running, queued, recent, failed, dead) and one request's
detail, read from the request hashes and the per model indexes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import orjson
import redis.asyncio
from pydantic import BaseModel

from producer.dashboard.values import int_or_none
from shared.errors import NotFound
from shared.keys import Keys, tag_of
from shared.priority import priority_name
from shared.records import STATUS_FIELDS
from shared.replies import text

ListKind = Literal["running", "queued", "recent", "failed", "dead"]
LIST_KINDS: tuple[ListKind, ...] = ("running", "queued", "recent", "failed", "dead")
ROW_FIELDS = (*STATUS_FIELDS, "dead_reason")
DETAIL_FIELDS = (*ROW_FIELDS, "payload", "final")
MAX_PROMPT_CHARS = 4000
MAX_MESSAGES = 50
_INDEX: dict[ListKind, Callable[[Keys, str], str]] = {
    "running": Keys.leases,
    "queued": Keys.queue,
    "recent": Keys.recent,
    "failed": Keys.failed,
    "dead": Keys.dead,
}


class RequestRow(BaseModel):
    id: str
    model: str
    state: str
    priority: int
    priority_name: str
    attempts: int = 0
    worker: str | None = None
    num_generated: int = 0
    created_ms: int | None = None
    started_ms: int | None = None
    first_token_ms: int | None = None
    finished_ms: int | None = None
    deadline_ms: int | None = None
    finish_reason: str | None = None
    dead_reason: str | None = None
    cancel_requested: bool = False
    ttft_s: float | None = None
    tenant: str | None = None


class RequestDetail(RequestRow):
    position: int | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt_truncated: bool = False
    parameters: dict[str, Any] = {}
    final: dict[str, Any] | None = None


async def request_list(
    r: redis.asyncio.Redis, keys: Keys, tags: list[str], kind: ListKind, limit: int
) -> list[RequestRow]:
    newest_first = kind in ("recent", "failed", "dead")
    pipe = r.pipeline(transaction=False)
    for tag in tags:
        pipe.zrange(_INDEX[kind](keys, tag), 0, limit - 1, desc=newest_first)
    ids = [text(m) for members in await pipe.execute() for m in members]
    rows = await rows_for(r, keys, ids)
    return sorted(rows, key=_order(kind))[:limit]


def _order(kind: ListKind) -> Callable[[RequestRow], Any]:
    if kind == "queued":
        return lambda row: (-row.priority, row.created_ms or 0)
    if kind == "running":
        return lambda row: row.started_ms or 0
    return lambda row: -(row.finished_ms or 0)


async def rows_for(r: redis.asyncio.Redis, keys: Keys, ids: list[str]) -> list[RequestRow]:
    """Rows for the ids whose hash still exists (an index may outlive a hash)."""
    pipe = r.pipeline(transaction=False)
    for rid in ids:
        pipe.hmget(keys.request(rid), ROW_FIELDS)
    replies = await pipe.execute()
    fields = [dict(zip(ROW_FIELDS, reply, strict=True)) for reply in replies]
    return [_row(rid, f) for rid, f in zip(ids, fields, strict=True) if f["state"] is not None]


def _row(request_id: str, f: dict[str, Any]) -> RequestRow:
    priority = int_or_none(f["priority"]) or 0
    created, first = int_or_none(f["created_ms"]), int_or_none(f["first_token_ms"])
    return RequestRow(
        id=request_id,
        model=text(f["model"] or ""),
        state=text(f["state"]),
        priority=priority,
        priority_name=priority_name(priority),
        attempts=int_or_none(f["attempts"]) or 0,
        worker=None if f["worker"] is None else text(f["worker"]),
        num_generated=int_or_none(f["num_generated"]) or 0,
        created_ms=created,
        started_ms=int_or_none(f["started_ms"]),
        first_token_ms=first,
        finished_ms=int_or_none(f["finished_ms"]),
        deadline_ms=int_or_none(f["deadline_ms"]),
        finish_reason=None if f["finish_reason"] is None else text(f["finish_reason"]),
        dead_reason=None if f["dead_reason"] is None else text(f["dead_reason"]),
        cancel_requested=f["cancel"] in (b"1", "1"),
        ttft_s=None if created is None or first is None else (first - created) / 1000,
        tenant=None if f["tenant"] is None else text(f["tenant"]),
    )


async def request_detail(r: redis.asyncio.Redis, keys: Keys, request_id: str) -> RequestDetail:
    key = keys.request(request_id)  # raises InvalidRequest for a malformed id
    pipe = r.pipeline(transaction=False)
    pipe.hmget(key, DETAIL_FIELDS)
    pipe.zrank(keys.queue(tag_of(request_id)), request_id)
    reply, rank = await pipe.execute()
    f = dict(zip(DETAIL_FIELDS, reply, strict=True))
    if f["state"] is None:
        raise NotFound(f"request {request_id} does not exist (or has expired)")
    row = _row(request_id, f)
    return RequestDetail(
        **row.model_dump(),
        position=rank,
        final=_json(f["final"]),
        **_payload(_json(f["payload"]) or {}),
    )


def _payload(payload: dict[str, Any]) -> dict[str, Any]:
    prompt, messages = payload.pop("prompt", None), payload.pop("messages", None)
    token_ids = payload.pop("prompt_token_ids", None)
    if token_ids is not None:  # up to a million: shown as text, cut like a long prompt
        prompt = f"(token ids, {len(token_ids)}) " + " ".join(str(i) for i in token_ids[:2000])
    truncated = prompt is not None and len(prompt) > MAX_PROMPT_CHARS
    if messages is not None:
        long = any(len(m.get("content", "")) > MAX_PROMPT_CHARS for m in messages)
        truncated = long or len(messages) > MAX_MESSAGES
        shown = messages[:MAX_MESSAGES]
        messages = [{**m, "content": m.get("content", "")[:MAX_PROMPT_CHARS]} for m in shown]
    for name in ("model", "priority", "deadline_ms", "version"):
        payload.pop(name, None)
    return {
        "prompt": None if prompt is None else prompt[:MAX_PROMPT_CHARS],
        "messages": messages,
        "prompt_truncated": truncated,
        "parameters": payload,
    }


def _json(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"unreadable": text(raw)[:MAX_PROMPT_CHARS]}
    return value if isinstance(value, dict) else {"value": value}
