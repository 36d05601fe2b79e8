"""Finding requests whose worker died, and queued requests whose deadline passed.

Any process may sweep (workers from their heartbeat, gateways from a background
task); a short lock per queue makes one sweep at a time.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio

from shared.keys import Keys
from shared.scripts import AsyncScripts, Reaped, Scripts, parse_reap, reap_call
from shared.settings import Settings

MAX_PER_SWEEP = 200


def _lock_ms(settings: Settings) -> int:
    return max(settings.lease_ms // 2, 100)


def _queue_candidates(pipe: Any, keys: Keys, tag: str, time_reply: Any) -> None:
    seconds, micros = time_reply
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    pipe.zrangebyscore(keys.leases(tag), "-inf", now_ms, start=0, num=MAX_PER_SWEEP)
    pipe.zrangebyscore(keys.deadlines(tag), "-inf", now_ms, start=0, num=MAX_PER_SWEEP)


def _ids(replies: list[Any]) -> list[str]:
    return sorted({m.decode() if isinstance(m, bytes) else str(m) for r in replies for m in r})


def reap_once(
    connection: redis.Redis, scripts: Scripts, settings: Settings, tag: str, owner: str
) -> Reaped | None:
    """One sweep of ``tag``'s queue, or None when another process holds the lock."""
    keys = Keys(settings.namespace)
    if not connection.set(keys.reaper_lock(tag), owner, nx=True, px=_lock_ms(settings)):
        return None
    pipe = connection.pipeline(transaction=False)
    _queue_candidates(pipe, keys, tag, connection.time())
    ids = _ids(pipe.execute())
    return parse_reap(scripts.run(reap_call(keys, settings, tag, ids))) if ids else Reaped()


async def reap_once_async(
    connection: redis.asyncio.Redis, scripts: AsyncScripts, settings: Settings, tag: str, owner: str
) -> Reaped | None:
    """The asyncio twin of ``reap_once``, for gateways."""
    keys = Keys(settings.namespace)
    if not await connection.set(keys.reaper_lock(tag), owner, nx=True, px=_lock_ms(settings)):
        return None
    pipe = connection.pipeline(transaction=False)
    _queue_candidates(pipe, keys, tag, await connection.time())
    ids = _ids(await pipe.execute())
    return parse_reap(await scripts.run(reap_call(keys, settings, tag, ids))) if ids else Reaped()
