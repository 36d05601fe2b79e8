"""Stream entries as the gateway passes them on: the event JSON as the worker wrote it.

Token events are the hot path (one per token per stream): native streams send their JSON
as it is, and it is parsed (with orjson, not pydantic) only when an OpenAI chunk needs its
text. Final events (one per request) are validated in full on arrival.
"""

from __future__ import annotations

from typing import Any

import orjson

from shared.models import FinalEvent, TokenEvent

# How ``shared.models.dumps`` writes a TokenEvent: its first field is the type.
TOKEN_PREFIX = b'{"type":"token"'
EVENT_FIELD = (b"e", "e")


class Entry:
    __slots__ = ("_fields", "data", "id", "is_final")

    def __init__(self, entry_id: str, data: bytes, fields: dict[str, Any] | None) -> None:
        self.id = entry_id
        self.data = data
        self.is_final = fields is not None and fields.get("type") == "final"
        self._fields = fields

    @property
    def type(self) -> str:
        return "final" if self.is_final else "token"

    @property
    def fields(self) -> dict[str, Any]:
        if self._fields is None:
            self._fields = _object(orjson.loads(self.data))
        return self._fields

    @property
    def text(self) -> str:
        text = self.fields.get("text")
        return text if isinstance(text, str) else ""

    def token(self) -> TokenEvent:
        return TokenEvent.model_validate(self.fields)

    def final(self) -> FinalEvent:
        return FinalEvent.model_validate(self.fields)


def parse_entry(entry_id: Any, fields: Any) -> Entry:
    """One XREAD entry (fields as a mapping or Redis's flat list); ValueError (pydantic's
    ValidationError is one) if it is neither a token event nor a valid final event."""
    data = _event_field(fields)
    entry_text = entry_id if isinstance(entry_id, str) else entry_id.decode()
    if data.startswith(TOKEN_PREFIX):
        return Entry(entry_text, data, None)
    parsed = _object(orjson.loads(data))
    if parsed.get("type") == "final":
        FinalEvent.model_validate(parsed)
    elif parsed.get("type") != "token" or not isinstance(parsed.get("text"), str):
        raise ValueError(f"not a token or final event: {data[:80]!r}")
    return Entry(entry_text, data, parsed)


def _event_field(fields: Any) -> bytes:
    is_flat = isinstance(fields, list | tuple)  # Redis's [name, value, ...]
    if is_flat and len(fields) == 2 and fields[0] in EVENT_FIELD:
        raw = fields[1]  # the one field a worker writes
    else:
        if is_flat:
            fields = dict(zip(fields[::2], fields[1::2], strict=False))
        raw = fields.get(b"e", fields.get("e"))
    data = raw.encode() if isinstance(raw, str) else raw
    if not isinstance(data, bytes):
        raise ValueError("entry has no event field 'e'")
    return data


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("event is not a JSON object")
    return value
