"""Finding requests whose worker died, and queued requests whose deadline passed.

Any process may sweep (workers do, from their heartbeat); a short lock per queue
makes one sweep at a time.
"""

from __future__ import annotations

import redis

from shared.keys import Keys
from shared.scripts import Reaped, Scripts, parse_reap, reap_call
from shared.settings import Settings

MAX_PER_SWEEP = 200


def reap_once(
    connection: redis.Redis, scripts: Scripts, settings: Settings, tag: str, owner: str
) -> Reaped | None:
    """One sweep of ``tag``'s queue, or None when another process holds the lock."""
    keys = Keys(settings.namespace)
    lock_ms = max(settings.lease_ms // 2, 100)
    if not connection.set(keys.reaper_lock(tag), owner, nx=True, px=lock_ms):
        return None
    seconds, micros = connection.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    pipe = connection.pipeline(transaction=False)
    pipe.zrangebyscore(keys.leases(tag), "-inf", now_ms, start=0, num=MAX_PER_SWEEP)
    pipe.zrangebyscore(keys.deadlines(tag), "-inf", now_ms, start=0, num=MAX_PER_SWEEP)
    expired_leases, passed_deadlines = pipe.execute()
    ids = sorted({_text(i) for i in [*expired_leases, *passed_deadlines]})
    if not ids:
        return Reaped()
    return parse_reap(scripts.run(reap_call(keys, settings, tag, ids)))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
