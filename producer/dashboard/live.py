"""Live updates as server-sent events.

``overview_events``: the overview every push interval, and each new history sample.
``request_events``: a request's status and its token stream from a cursor, ending
after the final event. Each loop step does bounded work (one overview, or one XRANGE
of at most ``STREAM_BATCH`` entries), and a connection ends after ``MAX_STREAM_S`` so
the page reconnects (from its last event id) rather than holding it for ever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from producer.dashboard.requests import request_detail
from producer.dashboard.service import Dashboard
from producer.streams.entries import Entry, readable_entries
from shared.errors import NotFound
from shared.keys import tag_of
from shared.replies import text

STREAM_BATCH = 256
STREAM_POLL_S = 0.25
STATUS_EVERY_S = 1.0
MAX_STREAM_S = 600.0


def frame(event: str, data: Any, event_id: str | None = None) -> bytes:
    head = b"" if event_id is None else b"id: " + event_id.encode() + b"\n"
    return head + b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def overview_events(dash: Dashboard) -> AsyncIterator[bytes]:
    ends_at = time.monotonic() + MAX_STREAM_S
    last_t: int | None = None
    while time.monotonic() < ends_at:
        yield frame("overview", (await dash.overview()).model_dump(mode="json"))
        sample = await dash.latest_sample()
        if sample is not None and sample["t"] != last_t:
            last_t = sample["t"]
            yield frame("sample", sample)
        await asyncio.sleep(dash.config.push_interval_s)


async def request_events(dash: Dashboard, request_id: str, after: str) -> AsyncIterator[bytes]:
    tag_of(request_id)
    cursor, ends_at, status_due = after, time.monotonic() + MAX_STREAM_S, 0.0
    ended = False
    while time.monotonic() < ends_at:
        if time.monotonic() >= status_due:
            status = await _status(dash, request_id)
            yield frame("status", status)
            if status["state"] == "gone":
                return
            ended = status["state"] not in ("queued", "running")
            status_due = time.monotonic() + STATUS_EVERY_S
        read_to, entries = await _read(dash, request_id, cursor)
        for entry in entries:
            yield frame(entry.type, entry.fields, entry.id)
            if entry.is_final:
                yield frame("status", await _status(dash, request_id))
                return
        if read_to == cursor and ended:
            return  # resumed past its final event: nothing more will come
        if read_to == cursor:
            await asyncio.sleep(STREAM_POLL_S)
        cursor = read_to


async def _status(dash: Dashboard, request_id: str) -> dict[str, Any]:
    try:
        detail = await request_detail(dash.redis, dash.keys, request_id)
    except NotFound:
        return {"id": request_id, "state": "gone"}
    return detail.model_dump(mode="json")


async def _read(dash: Dashboard, request_id: str, cursor: str) -> tuple[str, list[Entry]]:
    """The next entries after ``cursor`` that parse (others are skipped with a
    warning), and the cursor past every entry read."""
    key = dash.keys.stream(request_id)
    entries: Any = await dash.redis.xrange(key, f"({cursor}", "+", count=STREAM_BATCH)
    read_to = text(entries[-1][0]) if entries else cursor
    return read_to, readable_entries(key, entries)
