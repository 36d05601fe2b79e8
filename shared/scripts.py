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
from redis.exceptions import NoScriptError

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
    "charge",
    "ratelimit",
    "usage",
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
        """Run ``call`` now (reloading on NOSCRIPT), or queue it on ``pipe``: a plain
        EVALSHA, which a cluster pipeline also takes and which costs no SCRIPT EXISTS
        per pipeline (``send`` reloads on NOSCRIPT)."""
        if not self._loaded:
            self._load()
        script = self._by_name[call.script]
        if pipe is None:
            return script(keys=call.keys, args=call.args)
        return pipe.execute_command("EVALSHA", script.sha, len(call.keys), *call.keys, *call.args)

    def send(self, commands: Sequence[ScriptCall | tuple[Any, ...]]) -> list[Any]:
        """One pipelined round trip. After a Redis restart (NOSCRIPT) the scripts are
        loaded again and the round trip is sent again, so every step sent through here
        must be safe to repeat (each flow's steps are: see ``shared.flows``)."""
        try:
            return self._send(commands)
        except NoScriptError:
            self._load()
            return self._send(commands)

    def _send(self, commands: Sequence[ScriptCall | tuple[Any, ...]]) -> list[Any]:
        if not commands:
            return []
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            if isinstance(command, ScriptCall):
                self.run(command, pipe)
            else:
                pipe.execute_command(*command)
        return pipe.execute()

    def reload(self) -> None:
        self._load()

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
        """See ``Scripts.run``; queueing on ``pipe`` returns the pipe, not a coroutine."""
        if not self._loaded:
            await self._load()
        script = self._by_name[call.script]
        if pipe is None:
            return await script(keys=call.keys, args=call.args)
        return pipe.execute_command("EVALSHA", script.sha, len(call.keys), *call.keys, *call.args)

    async def send(self, commands: Sequence[ScriptCall | tuple[Any, ...]]) -> list[Any]:
        """The asyncio twin of ``Scripts.send``."""
        try:
            return await self._send(commands)
        except NoScriptError:
            await self._load()
            return await self._send(commands)

    async def _send(self, commands: Sequence[ScriptCall | tuple[Any, ...]]) -> list[Any]:
        if not commands:
            return []
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            if isinstance(command, ScriptCall):
                await self.run(command, pipe)
            else:
                pipe.execute_command(*command)
        return await pipe.execute()

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
