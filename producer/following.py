"""What the sync and asyncio clients share to follow a request through the stream hub:
how an entry becomes events, and where waiting for a result starts."""

from __future__ import annotations

import time
from typing import Any

from producer.streams.entries import warn_unreadable
from shared.errors import RequestTimeout
from shared.keys import Keys
from shared.models import FinalEvent, Result, StreamEvent, TokenEvent
from shared.reads import Read, parse_xread, result_read
from shared.replies import text

START = "0-0"
BLOCK_MS = 2_000  # the longest a follower's read blocks before it looks again
MAX_LOOKUPS = 32  # followers looking Redis up at once, per client


def parse_events(key: str, entry_id: str, fields: Any) -> list[StreamEvent]:
    """One stream entry as the events a client reads, as ``parse_xread`` reads them;
    none, with a warning, for an entry that does not parse (the stream goes on)."""
    try:
        return parse_xread([[key, [(entry_id, fields)]]])
    except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
        warn_unreadable(key, entry_id, e)
        return []


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


class Unrepeated:
    """One reader's view of a stream with nothing repeated: after a Redis failover the new
    primary may lack the last token events a reader already had from the old one, and
    they are written again from where its stream ends (the request resumes from it); the
    reader gets the tokens it lacks, once. Events are kept by the index of their tokens."""

    def __init__(self) -> None:
        self.next_index: int | None = None

    def events(self, events: list[StreamEvent]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for e in events:
            if isinstance(e.event, TokenEvent):
                fresh = self.fresh(e.event)
                if fresh is None:
                    continue
                e = e if fresh is e.event else StreamEvent(id=e.id, event=fresh)
            out.append(e)
        return out

    def fresh(self, event: TokenEvent) -> TokenEvent | None:
        """``event``, the part of it not seen yet, or None."""
        end = event.index + len(event.token_ids)
        if self.next_index is None or event.index >= self.next_index:
            self.next_index = end
            return event
        seen, self.next_index = self.next_index, max(end, self.next_index)
        steps = [s for s in event.split() if s.index + len(s.token_ids) > seen]
        return TokenEvent.coalesce(steps) if steps else None


def deadline_of(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def block_ms(give_up: float | None, timeout: float | None, request_id: str) -> int:
    """How long the next blocking read may wait; RequestTimeout once time is up."""
    if give_up is None:
        return BLOCK_MS
    left_ms = int((give_up - time.monotonic()) * 1000)
    if left_ms <= 0:
        raise RequestTimeout(f"request {request_id} did not finish within {timeout}s")
    return max(1, min(left_ms, BLOCK_MS))
