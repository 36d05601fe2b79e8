"""What the loop reads of its model's queue before it claims: which heads to try, and
whether anything left is a request this worker could serve."""

from __future__ import annotations

import logging
from typing import Any

import redis

from shared.keys import REQUEST_ID_RE, Keys
from shared.priority import FRESH_OFFSET
from shared.replies import text

log = logging.getLogger(__name__)


def candidates(connection: redis.Redis, keys: Keys, tag: str, room: int, free: int) -> list[Any]:
    """Queue heads to claim: resumed ones up to ``room``, new ones up to ``free``
    in all (one round trip, with the pause flag; nothing while paused)."""
    last = "+inf" if free > 0 else f"({FRESH_OFFSET}"  # full: resumed ones only
    pipe = connection.pipeline(transaction=False)
    pipe.exists(keys.paused(tag))
    pipe.zrange(keys.queue(tag), 0, last, byscore=True, offset=0, num=room, withscores=True)
    paused, heads = pipe.execute()
    if paused:
        return []
    picked: list[Any] = []
    for member, score in heads:
        if len(picked) < (room if score < FRESH_OFFSET else free):
            picked.append(member)
    return picked


def valid_ids(connection: redis.Redis, keys: Keys, tag: str, members: list[Any]) -> list[str]:
    """Queue members that are request ids; anything else was written by hand or by
    a broken client, and is taken off the queue so it cannot block it."""
    ids = [text(m) for m in members]
    bad = [i for i in ids if REQUEST_ID_RE.match(i) is None]
    if bad:
        log.error("removing malformed queue entries %r", bad)
        connection.zrem(keys.queue(tag), *bad)
    return [i for i in ids if i not in bad]


def can_serve_queued(connection: redis.Redis, keys: Keys, tag: str, rank_limit: int) -> bool:
    """Whether the queue holds a request a worker serving adapters up to ``rank_limit``
    could claim: adapter requests over it wait for a worker that serves them, so a
    burst run ends without them (claim.lua)."""
    queue = keys.queue(tag)
    num_queued = int(connection.zcard(queue))
    if not num_queued:
        return False
    beyond: list[Any] = connection.zrange(
        keys.lora_ranks(tag), f"({rank_limit}", "+inf", byscore=True
    )
    if not beyond:
        return True
    scores: list[Any] = connection.zmscore(queue, beyond)
    return num_queued > sum(score is not None for score in scores)
