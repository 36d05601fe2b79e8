"""Reading what the scripts wrote: request hashes and stream entries to models."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from pydantic import TypeAdapter

from shared.errors import NotFound
from shared.models import Event, FinalEvent, RequestState, RequestStatus, Result, StreamEvent
from shared.replies import text

STATUS_FIELDS = (
    "model",
    "state",
    "priority",
    "attempts",
    "worker",
    "num_generated",
    "created_ms",
    "started_ms",
    "first_token_ms",
    "finished_ms",
    "deadline_ms",
    "finish_reason",
    "cancel",
    "tenant",
)
RESULT_FIELDS = ("model", "state", "final", "output")

_event_adapter: TypeAdapter[Event] = TypeAdapter(Event)


def decode_hash(raw: Mapping[Any, Any] | Sequence[Any], fields: Sequence[str]) -> dict[str, str]:
    """A hash read with HGETALL (mapping) or HMGET (list, in ``fields`` order), as text."""
    if isinstance(raw, Mapping):
        items = [(text(k), v) for k, v in raw.items()]
    else:
        items = list(zip(fields, raw, strict=True))
    return {k: text(v) for k, v in items if v is not None}


def status_from_hash(request_id: str, h: dict[str, str], position: int | None) -> RequestStatus:
    if "state" not in h:
        raise NotFound(f"request {request_id} does not exist (or has expired)")
    return RequestStatus(
        id=request_id,
        model=h.get("model", ""),
        state=RequestState(h["state"]),
        priority=int(h.get("priority", 0)),
        attempts=int(h.get("attempts", 0)),
        position=position,
        worker=h.get("worker"),
        num_generated=int(h.get("num_generated", 0)),
        created_ms=_int(h.get("created_ms")),
        started_ms=_int(h.get("started_ms")),
        first_token_ms=_int(h.get("first_token_ms")),
        finished_ms=_int(h.get("finished_ms")),
        deadline_ms=_int(h.get("deadline_ms")),
        finish_reason=h.get("finish_reason"),
        cancel_requested=h.get("cancel") == "1",
        tenant=h.get("tenant"),
    )


def result_from_hash(request_id: str, h: dict[str, str]) -> Result | None:
    """The result once the request has ended, else ``None``."""
    if "state" not in h:
        raise NotFound(f"request {request_id} does not exist (or has expired)")
    if not RequestState(h["state"]).terminal or "final" not in h:
        return None
    final = FinalEvent.model_validate_json(h["final"])
    output = orjson.loads(h.get("output", '{"text": "", "token_ids": []}'))
    return Result(
        id=request_id,
        model=h.get("model", ""),
        text=output["text"],
        token_ids=output["token_ids"],
        finish_reason=final.finish_reason,
        usage=final.usage,
        timings=final.timings,
        error=final.error,
        embedding=final.embedding,
        prompt_logprobs=final.prompt_logprobs,
        refusal=final.refusal,
    )


def stream_event(entry_id: Any, fields: Mapping[Any, Any]) -> StreamEvent:
    """One XRANGE/XREAD entry as a StreamEvent."""
    data = fields.get(b"e", fields.get("e"))
    return StreamEvent(id=text(entry_id), event=_event_adapter.validate_json(data))


def _int(value: str | None) -> int | None:
    return None if value is None else int(value)
