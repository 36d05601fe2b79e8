"""Scripts that take many requests in one call (start, publish) take requests of one
hash slot per call on a Redis Cluster: the runs of consecutive requests on one slot."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from redis.crc import key_slot

from shared.keys import request_tag


class _HasId(Protocol):
    @property
    def request_id(self) -> str: ...


T = TypeVar("T", bound=_HasId)


def slot_of(request_id: str) -> int:
    """The hash slot of a request's keys (its hash, stream and idempotency key)."""
    return key_slot(request_tag(request_id).encode())


def by_slot(
    items: Sequence[T], cluster: bool, slot: Callable[[str], int] = slot_of
) -> list[list[T]]:
    """One run for everything on one Redis; on a cluster, one run per stretch of
    consecutive items on one slot (sort by ``slot_of`` first to make the runs long:
    request tags fall on few slots, see shared/keys.py)."""
    if not items:
        return []
    if not cluster:
        return [list(items)]
    runs: list[list[T]] = []
    last = -1
    for item in items:
        current = slot(item.request_id)
        if current != last:
            runs.append([])
            last = current
        runs[-1].append(item)
    return runs
