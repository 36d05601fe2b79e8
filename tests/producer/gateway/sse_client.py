"""Reading server-sent events in tests, bounded in count and time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx

MAX_LINES = 100_000


@dataclass
class Message:
    data: str
    id: str | None = None
    event: str | None = None


def messages(response: httpx.Response, limit: int = MAX_LINES) -> Iterator[Message]:
    """The SSE messages of a streamed response (comments skipped)."""
    fields: dict[str, str] = {}
    for n, line in enumerate(response.iter_lines()):
        if n >= limit:
            raise AssertionError(f"more than {limit} SSE lines")
        if not line:
            if "data" in fields:
                yield Message(fields["data"], fields.get("id"), fields.get("event"))
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
