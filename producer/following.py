"""What the sync and asyncio clients share to follow a request through the stream hub:
how an entry becomes events, and where waiting for a result starts."""

from __future__ import annotations

from typing import Any

from shared.keys import Keys
from shared.models import FinalEvent, Result, StreamEvent
from shared.reads import Read, parse_xread, result_read
from shared.replies import text

START = "0-0"


def parse_events(key: str, entry_id: str, fields: Any) -> list[StreamEvent]:
    """One stream entry as the events a client reads, as ``parse_xread`` reads them
    (raises, and so ends the follower's stream, for an entry it cannot read)."""
    return parse_xread([[key, [(entry_id, fields)]]])


def has_final(events: list[StreamEvent]) -> bool:
    return any(isinstance(e.event, FinalEvent) for e in events)


def result_or_tail(keys: Keys, request_id: str) -> Read[tuple[Result | None, str]]:
    """The result, or where the stream ends now: its final event comes after that. The
    tail is read first, and a final event is written with the result in one script, so
    a result missing here is announced after the tail."""
    results = result_read(keys, request_id)

    def parse(replies: list[Any]) -> tuple[Result | None, str]:
        tail, *rest = replies
        return results.parse(rest), text(tail[0][0]) if tail else START

    tail_command = ("XREVRANGE", keys.stream(request_id), "+", "-", "COUNT", 1)
    return Read([tail_command, *results.commands], parse)
