"""Stored responses in Redis: the record is one field of the request's own hash, so it
sits on the request's slot, is read with its state and stream in one round trip, belongs
to the request's tenant, and expires with the request (``TOKENQ_RESULT_TTL_S`` after it
ends)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio

from producer.openai.errors import ApiError
from producer.responses.record import StoredResponse, response_id
from producer.streams.entries import Entry, readable_entries
from shared.keys import Keys
from shared.models import RequestState
from shared.replies import text

FIELD = "response"  # the request hash's field that holds the record


@dataclass(frozen=True)
class View:
    """A stored response as it is now: its record, its request's state and stream."""

    record: StoredResponse
    state: RequestState
    entries: list[Entry]

    @property
    def last_id(self) -> str:
        return self.entries[-1].id if self.entries else "0-0"


async def save(
    connection: redis.asyncio.Redis, keys: Keys, record: StoredResponse
) -> StoredResponse:
    """Store ``record`` with its request, unless a record is there already (a repeated
    idempotency key: the first one stands, and is returned)."""
    h = keys.request(record.request_id)
    pipe = connection.pipeline(transaction=False)
    pipe.hsetnx(h, FIELD, record.model_dump_json())
    pipe.hget(h, FIELD)
    pipe.hexists(h, "state")
    _, stored, exists = await pipe.execute()
    if not exists:  # the request ended and expired already: drop the stray hash made here
        await connection.delete(h)
        raise not_found(record.id)
    return StoredResponse.model_validate_json(stored)


async def read(
    connection: redis.asyncio.Redis, keys: Keys, request_id: str, scope: str | None
) -> View:
    """The response of ``request_id``; 404 when there is none (never stored, deleted,
    expired) or it is another tenant's (``scope``)."""
    pipe = connection.pipeline(transaction=False)
    pipe.hmget(keys.request(request_id), "state", "tenant", FIELD)
    pipe.xrange(keys.stream(request_id))
    (state, tenant, raw), entries = await pipe.execute()
    if raw is None or state is None or (scope is not None and _text(tenant) != scope):
        raise not_found(response_id(request_id))
    return View(
        StoredResponse.model_validate_json(raw),
        RequestState(text(state)),
        readable_entries(keys.stream(request_id), entries),
    )


async def delete(connection: redis.asyncio.Redis, keys: Keys, request_id: str) -> None:
    await connection.hdel(keys.request(request_id), FIELD)


def _text(value: Any) -> str | None:
    return None if value is None else text(value)


def not_found(value: str, param: str | None = None) -> ApiError:
    return ApiError(
        404,
        f"response {value!r} does not exist: it was never stored (store: false), was "
        "deleted, or has expired",
        type="not_found_error",
        param=param,
        code="response_not_found",
    )
