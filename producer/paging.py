"""Cursor pages over a sorted-set index, in the shape of OpenAI's list objects
(``after`` an id, ``limit``, ``has_more``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import redis

from shared.errors import InvalidParam
from shared.replies import text

T = TypeVar("T")
SCAN_IDS = 100
# Reads the objects of some ids, in order, leaving out those the caller may not see
# (another tenant's, expired, another purpose).
Load = Callable[[Sequence[str]], list[T]]


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    has_more: bool


def page(
    r: redis.Redis, index: str, load: Load[T], *, after: str | None, limit: int, newest_first: bool
) -> Page[T]:
    """Up to ``limit`` objects that come after ``after`` (an id in ``index``) in the
    index's order; InvalidParam (``after``) for an id the index does not hold."""
    start = 0 if after is None else _rank(r, index, after, newest_first) + 1
    found: list[T] = []
    while len(found) <= limit:
        end = start + SCAN_IDS - 1
        ids = r.zrevrange(index, start, end) if newest_first else r.zrange(index, start, end)
        if not ids:
            break
        start += len(ids)
        found += load([text(i) for i in ids])
    return Page(found[:limit], len(found) > limit)


def _rank(r: redis.Redis, index: str, after: str, newest_first: bool) -> int:
    rank = r.zrevrank(index, after) if newest_first else r.zrank(index, after)
    if rank is None:
        raise InvalidParam("after", f"{after!r} is not in this list (give its last item's id)")
    return int(rank)  # type: ignore[arg-type]
