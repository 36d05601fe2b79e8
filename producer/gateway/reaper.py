"""Gateways sweep for requests whose worker died, as workers do: whichever process
holds a queue's short reaper lock sweeps it (shared/reaper.py)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

import redis

from shared.errors import ReplicationTimeout
from shared.keys import Keys
from shared.reaper import reap_once_async
from shared.registry import KNOWN_MODELS_LIMIT
from shared.replication import Replicas
from shared.replies import text
from shared.scripts import AsyncScripts
from shared.settings import Settings

log = logging.getLogger(__name__)


async def reap_forever(connection: redis.asyncio.Redis, settings: Settings) -> None:
    """Sweep every known model's queue every half lease, until cancelled."""
    keys, scripts = Keys(settings.namespace), AsyncScripts(connection, Replicas.of(settings))
    owner = f"gateway-{secrets.token_hex(4)}"
    failed_s = -float("inf")
    while True:
        await asyncio.sleep(settings.lease_ms / 2000)
        # Not for a lease after Redis was away: live workers renew their lapsed leases first.
        if time.monotonic() - failed_s <= settings.lease_ms / 1000:
            continue
        try:
            tags = await connection.hkeys(keys.models())
            for tag in tags[:KNOWN_MODELS_LIMIT]:
                await reap_once_async(connection, scripts, settings, text(tag), owner)
        except (redis.RedisError, ReplicationTimeout) as e:
            failed_s = time.monotonic()
            log.warning("reaper sweep failed (%s); trying again", e)
