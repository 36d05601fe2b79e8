"""Stream entries as every reader takes them (gateway, OpenAI translation, batches):
the event JSON as the worker wrote it.

Token events are the hot path (one per token per stream): native streams send their JSON
as it is, once orjson has parsed it and its fields are checked by hand (not pydantic).
Final events (one per request) are validated in full on arrival. An entry that does not
read as either is skipped with a warning by every reader (``readable_entries``).
"""

from __future__ import annotations

import logging
from typing import Any, TypeGuard

import orjson

from shared.models import FinalEvent, TokenEvent

log = logging.getLogger("producer.streams")
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
    ValidationError is one) if it is neither a well-formed token event nor a valid final
    event. Token events are checked field by field (a pydantic model per token entry
    costs the gateway several µs each), as strictly as ``TokenEvent`` would. The data
    kept holds no line break, so a native SSE frame of it is one event whatever the
    entry's text: a line break inside JSON can only be whitespace, and is dropped."""
    data = _event_field(fields)
    entry_text = entry_id if isinstance(entry_id, str) else entry_id.decode()
    try:
        parsed = _object(orjson.loads(data))
    except orjson.JSONDecodeError as e:
        raise ValueError(f"not JSON: {data[:80]!r}") from e
    if parsed.get("type") == "final":
        FinalEvent.model_validate(parsed)
    else:
        check_token(parsed)
    if b"\n" in data or b"\r" in data:
        data = orjson.dumps(parsed)
    return Entry(entry_text, data, parsed)


TOKEN_FIELDS = frozenset(TokenEvent.model_fields)


def check_token(event: dict[str, Any]) -> None:
    """ValueError unless ``event`` is what ``TokenEvent`` accepts."""
    unknown = set(event) - TOKEN_FIELDS
    if event.get("type") != "token" or unknown:
        raise ValueError(f"not a token or final event (type {event.get('type')!r}, {unknown})")
    index, token_ids, text = event.get("index"), event.get("token_ids"), event.get("text")
    if not _is_int(index) or index < 0 or not isinstance(text, str):
        raise ValueError("a token event needs an index >= 0 and a text")
    if not isinstance(token_ids, list) or not all(_is_int(t) for t in token_ids):
        raise ValueError("a token event's token_ids must be a list of integers")
    logprobs = event.get("logprobs")
    if logprobs is not None and not (
        isinstance(logprobs, list) and all(isinstance(x, dict) for x in logprobs)
    ):
        raise ValueError("a token event's logprobs must be a list of objects")
    _check_steps(event.get("steps"), len(token_ids), len(text))


def _check_steps(steps: Any, num_tokens: int, num_chars: int) -> None:
    if steps is None:
        return
    pairs = steps if isinstance(steps, list) else None
    if pairs is None or not all(
        isinstance(p, list) and len(p) == 2 and all(_is_int(n) and n >= 0 for n in p) for p in pairs
    ):
        raise ValueError("a token event's steps must be pairs of counts")
    if (sum(p[0] for p in pairs), sum(p[1] for p in pairs)) != (num_tokens, num_chars):
        raise ValueError("a token event's steps do not cover its tokens and text")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def readable_entries(key: Any, entries: Any) -> list[Entry]:
    """An XRANGE/XREAD reply's entries that parse; each one that does not is skipped
    with a warning (a stream's reader goes on past it)."""
    readable = []
    for entry_id, fields in entries or ():
        try:
            readable.append(parse_entry(entry_id, fields))
        except (ValueError, TypeError) as e:
            warn_unreadable(key, entry_id, e)
    return readable


def warn_unreadable(key: Any, entry_id: Any, error: Exception) -> None:
    log.warning("skipping unreadable entry %s of %s: %s", _str(entry_id), _str(key), error)


def _str(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


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


TOKEN_HEAD = b'{"type":"token","index":'


def token_span(entry: Entry) -> tuple[int, int]:
    """(index of its first token, number of tokens) of a token entry, read off the JSON
    as workers write it, without parsing it (parsed when written otherwise)."""
    data = entry.data
    if entry._fields is None and data.startswith(TOKEN_HEAD):
        comma = data.find(b",", len(TOKEN_HEAD))
        start = data.find(b'"token_ids":[', comma)
        end = data.find(b"]", start)
        if comma > 0 and start == comma + 1 and end > 0:
            ids = data[start + len(b'"token_ids":[') : end]
            return int(data[len(TOKEN_HEAD) : comma]), ids.count(b",") + 1 if ids else 0
    fields = entry.fields
    return int(fields.get("index", 0)), len(fields.get("token_ids") or ())


class UnrepeatedEntries:
    """``producer.following.Unrepeated`` for the gateway's entries: what a client was
    sent is not sent again when a failover makes a worker write it again."""

    def __init__(self) -> None:
        self.next_index: int | None = None

    def entries(self, batch: list[Entry]) -> list[Entry]:
        return [e for e in (self._fresh(e) for e in batch) if e is not None]

    def _fresh(self, entry: Entry) -> Entry | None:
        if entry.is_final:
            return entry
        index, num_tokens = token_span(entry)
        end = index + num_tokens
        if self.next_index is None or index >= self.next_index:
            self.next_index = end
            return entry
        seen, self.next_index = self.next_index, max(end, self.next_index)
        steps = [s for s in entry.token().split() if s.index + len(s.token_ids) > seen]
        return Entry(entry.id, TokenEvent.coalesce(steps).wire(), None) if steps else None
