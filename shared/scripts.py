"""The Lua scripts in ``shared/lua``, registered once per connection.

Each script touches one hash slot (see the header of ``shared/lua/_lib.lua`` for how a
change that spans a request's slot and its model's runs as two scripts). Calls are
built by pure functions in ``shared.calls``; multi-step operations are sequenced in
``shared.flows``; this module only sends them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from shared.priority import lua_constants

SCRIPT_NAMES = (
    "admit",
    "enqueue",
    "withdraw",
    "claim",
    "start",
    "publish",
    "finish",
    "fence",
    "settle",
    "cancel",
    "expire",
    "renew",
    "reset",
    "retry",
)
ARG = str | int | float


@cache
def load_source(name: str) -> str:
    """The script's source with the shared constants and helper library in front of it."""
    lua = resources.files("shared") / "lua"
    library = (lua / "_lib.lua").read_text()
    return lua_constants() + library + "\n" + (lua / f"{name}.lua").read_text()


@dataclass(frozen=True)
class ScriptCall:
    script: str
    keys: Sequence[str]
    args: Sequence[ARG]


class Scripts:
    """The scripts registered on one sync connection (EVALSHA after one SCRIPT LOAD)."""

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        self._client = client
        self._by_name = {n: client.register_script(load_source(n)) for n in SCRIPT_NAMES}
        self._loaded = False

    def run(self, call: ScriptCall, pipe: Any = None) -> Any:
        if not self._loaded:
            self._load()
        return self._by_name[call.script](keys=call.keys, args=call.args, client=pipe)

    def _load(self) -> None:
        # Load every script before the first EVALSHA rather than on a NOSCRIPT reply:
        # fakeredis's TCP server (the fallback of `tokenq up`) drops the connection on
        # that error. After a Redis restart redis-py reloads on NOSCRIPT by itself.
        # On a cluster, SCRIPT LOAD goes to every primary.
        if isinstance(self._client, RedisCluster):
            for script in self._by_name.values():
                self._client.script_load(script.script)
        else:
            pipe = self._client.pipeline(transaction=False)
            for script in self._by_name.values():
                pipe.script_load(script.script)
            pipe.execute()
        self._loaded = True


class AsyncScripts:
    """The scripts registered on one asyncio connection."""

    def __init__(self, client: redis.asyncio.Redis | AsyncRedisCluster) -> None:
        self._client = client
        self._by_name = {n: client.register_script(load_source(n)) for n in SCRIPT_NAMES}
        self._loaded = False

    async def run(self, call: ScriptCall, pipe: Any = None) -> Any:
        if not self._loaded:
            await self._load()
        return await self._by_name[call.script](keys=call.keys, args=call.args, client=pipe)

    async def _load(self) -> None:
        if isinstance(self._client, AsyncRedisCluster):
            for script in self._by_name.values():
                await self._client.script_load(script.script)
        else:
            pipe = self._client.pipeline(transaction=False)
            for script in self._by_name.values():
                pipe.script_load(script.script)
            await pipe.execute()
        self._loaded = True
