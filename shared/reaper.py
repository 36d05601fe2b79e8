"""Finding requests whose worker died, and queued requests whose deadline passed.

Any process may sweep (workers from their heartbeat, gateways from a background
task); a short lock per queue makes one sweep at a time. Each found request is
fenced on its own slot before its model's keys move (``shared.flows``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.flows import Flow, drive, drive_async, ended_flow, fence_flow
from shared.keys import Keys
from shared.ops.moves import EndOutcome, EndScript, Fate, FenceMode, Moved
from shared.replies import text
from shared.scripts import AsyncScripts, Scripts
from shared.settings import Settings

MAX_PER_SWEEP = 200


@dataclass(frozen=True)
class Reaped:
    requeued: int = 0
    dead: int = 0
    ended: int = 0  # expired while queued, or cancelled while its worker died


def _lock_ms(settings: Settings) -> int:
    return max(settings.lease_ms // 2, 100)


def _ids(reply: list[Any]) -> list[str]:
    return sorted({text(m) for m in reply})


def reap_flow(keys: Keys, settings: Settings, tag: str, owner: str) -> Flow[Reaped | None]:
    """One sweep of ``tag``'s queue, or None when another process holds the lock."""
    lock = ("SET", keys.reaper_lock(tag), owner, "NX", "PX", _lock_ms(settings))
    locked, (seconds, micros) = yield [lock, ("TIME",)]
    if not locked:
        return None
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    window = ("-inf", now_ms, "LIMIT", 0, MAX_PER_SWEEP)
    lapsed, late = yield [
        ("ZRANGEBYSCORE", keys.leases(tag), *window),
        ("ZRANGEBYSCORE", keys.deadlines(tag), *window),
    ]
    expired = _ids(lapsed)
    tokens = yield [("HMGET", keys.owners(tag), *expired)] if expired else []
    held = {i: text(t) for i, t in zip(expired, tokens[0] if tokens else [], strict=False) if t}
    fenced = yield from fence_flow(keys, settings, tag, held, FenceMode.REAP)
    queued = [i for i in _ids(late) if i not in held]
    expiring = yield from ended_flow(keys, settings, EndScript.EXPIRE, queued)
    return _count(fenced, expiring)


def _count(fenced: list[Moved], expiring: list[EndOutcome]) -> Reaped:
    states = [m.state for m in fenced]
    ended = states.count(Fate.CANCELLED) + expiring.count(EndOutcome.EXPIRED)
    return Reaped(requeued=states.count(Fate.QUEUED), dead=states.count(Fate.DEAD), ended=ended)


def reap_once(
    connection: Any, scripts: Scripts, settings: Settings, tag: str, owner: str
) -> Reaped | None:
    return drive(scripts, reap_flow(Keys(settings.namespace), settings, tag, owner))


async def reap_once_async(
    connection: Any, scripts: AsyncScripts, settings: Settings, tag: str, owner: str
) -> Reaped | None:
    """The asyncio twin of ``reap_once``, for gateways."""
    flow = reap_flow(Keys(settings.namespace), settings, tag, owner)
    return await drive_async(scripts, flow)
