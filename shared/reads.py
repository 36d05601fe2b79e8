"""Reads of a request, as data: the commands to send in one round trip and the parser
of their replies. Sans-IO, so the sync client, the asyncio client and the gateway send
the same commands and read the replies the same way; each only supplies a transport
(``run_read`` or ``run_read_async``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis
import redis.asyncio

from shared.keys import Keys, tag_of
from shared.models import RequestStatus, Result, StreamEvent
from shared.records import (
    RESULT_FIELDS,
    STATUS_FIELDS,
    decode_hash,
    result_from_hash,
    status_from_hash,
    stream_event,
)

T = TypeVar("T")
VIEW_FIELDS = (*STATUS_FIELDS, "final", "output")


@dataclass(frozen=True)
class Read(Generic[T]):
    """Commands sent together, and what their replies mean."""

    commands: Sequence[tuple[Any, ...]]
    parse: Callable[[list[Any]], T]


def status_read(keys: Keys, request_id: str) -> Read[RequestStatus]:
    """Status with the queue position; NotFound when the request does not exist."""

    def parse(replies: list[Any]) -> RequestStatus:
        raw, rank = replies
        return status_from_hash(request_id, decode_hash(raw, STATUS_FIELDS), _rank(rank))

    return Read(_with_rank(keys, request_id, STATUS_FIELDS), parse)


def view_read(keys: Keys, request_id: str) -> Read[tuple[RequestStatus, Result | None]]:
    """Status and, once it has ended, the result."""

    def parse(replies: list[Any]) -> tuple[RequestStatus, Result | None]:
        raw, rank = replies
        fields = decode_hash(raw, VIEW_FIELDS)
        return status_from_hash(request_id, fields, _rank(rank)), result_from_hash(
            request_id, fields
        )

    return Read(_with_rank(keys, request_id, VIEW_FIELDS), parse)


def result_read(keys: Keys, request_id: str) -> Read[Result | None]:
    """The result once the request has ended, else None; NotFound when it does not exist."""

    def parse(replies: list[Any]) -> Result | None:
        return result_from_hash(request_id, decode_hash(replies[0], RESULT_FIELDS))

    return Read([("HMGET", keys.request(request_id), *RESULT_FIELDS)], parse)


def position_read(keys: Keys, request_id: str) -> Read[int | None]:
    """Requests ahead in the queue (0: next), or None once claimed."""
    return Read([("ZRANK", keys.queue(tag_of(request_id)), request_id)], lambda r: _rank(r[0]))


def parse_xread(reply: Any) -> list[StreamEvent]:
    """The events of an XREAD of one stream (empty when it timed out)."""
    return [stream_event(entry_id, fields) for entry_id, fields in reply[0][1]] if reply else []


def run_read(connection: redis.Redis, read: Read[T]) -> T:
    pipe = connection.pipeline(transaction=False)
    for command in read.commands:
        pipe.execute_command(*command)  # type: ignore[no-untyped-call]
    return read.parse(pipe.execute())


async def run_read_async(connection: redis.asyncio.Redis, read: Read[T]) -> T:
    pipe = connection.pipeline(transaction=False)
    for command in read.commands:
        pipe.execute_command(*command)
    return read.parse(await pipe.execute())


def _with_rank(keys: Keys, request_id: str, fields: Sequence[str]) -> list[tuple[Any, ...]]:
    return [
        ("HMGET", keys.request(request_id), *fields),
        ("ZRANK", keys.queue(tag_of(request_id)), request_id),
    ]


def _rank(rank: Any) -> int | None:
    return None if rank is None else int(rank)
