"""The Lua scripts in ``shared/lua``, registered once per connection.

Each script touches one hash slot (see the header of ``shared/lua/_lib.lua`` for how a
change that spans a request's slot and its model's runs as two scripts). Calls are
built by the typed units of ``shared.ops``; multi-step operations are sequenced in
``shared.flows``; this module only sends them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, cast

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from shared.connection import UNREACHABLE, refresh, refresh_async
from shared.priority import lua_constants
from shared.replication import (
    CONFIRM_REPLIES,
    NO_REPLICAS,
    Confirm,
    Replicas,
    confirm_cluster,
    confirm_cluster_async,
)

SCRIPT_NAMES = (
    "admit",
    "enqueue",
    "withdraw",
    "claim",
    "start",
    "publish",
    "fence",
    "settle",
    "cancel",
    "expire",
    "renew",
    "renew_owned",
    "warm",
    "reset",
    "retry",
    "ratelimit",
    "usage",
)
ARG = str | int | float


@cache
def load_source(name: str) -> str:
    """The script's source with the shared constants and the parts of the helper library
    it uses in front of it (the library runs on every call: what a script never calls
    would cost it a closure per function per call)."""
    lua = resources.files("shared") / "lua"
    body = (lua / f"{name}.lua").read_text()
    return lua_constants() + used_library((lua / "_lib.lua").read_text(), body) + "\n" + body


LUA_FUNCTION = re.compile(r"^local function (\w+)", re.MULTILINE)


def used_library(library: str, body: str) -> str:
    """The chunks of ``library`` (blank-line separated, each defining functions) that
    ``body`` calls, and those they call, in the library's order."""
    chunks = [(c, LUA_FUNCTION.findall(c)) for c in library.split("\n\n")]
    needed, text = set[str](), body
    while True:
        more = {n for c, names in chunks for n in names if n not in needed and f"{n}(" in text}
        if not more:
            break
        needed |= more
        text = "\n".join(c for c, names in chunks if needed & set(names)) + body
    return "\n\n".join(c for c, names in chunks if needed & set(names))


@dataclass(frozen=True)
class ScriptCall:
    script: str
    keys: Sequence[str]
    args: Sequence[ARG]


class Scripts:
    """The scripts registered on one sync connection (EVALSHA after one SCRIPT LOAD).
    ``replicas``: what a round trip sent with a ``Confirm`` waits for (``shared.replication``)."""

    def __init__(
        self, client: redis.Redis | RedisCluster, replicas: Replicas = NO_REPLICAS
    ) -> None:
        self._client = client
        self.replicas = replicas
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

    def send(
        self, commands: Sequence[ScriptCall | tuple[Any, ...]], confirm: Confirm | None = None
    ) -> list[Any]:
        """One pipelined round trip. After a Redis restart (NOSCRIPT) the scripts are
        loaded again and the round trip is sent again, so every step sent through here
        must be safe to repeat (each flow's steps are: see ``shared.flows``). With
        ``confirm`` and replicas wanted, it returns once they have the writes
        (ReplicationTimeout if not in time)."""
        confirm = confirm if self.replicas.wanted and confirm and confirm.keys else None
        try:
            return self._send(commands, confirm)
        except NoScriptError:
            self._load()
            return self._send(commands, confirm)
        except UNREACHABLE:
            self.replicas.forget()
            refresh(self._client)  # a cluster's master may have failed over
            raise

    def _send(
        self, commands: Sequence[ScriptCall | tuple[Any, ...]], confirm: Confirm | None
    ) -> list[Any]:
        if not commands and confirm is None:
            return []
        cluster = isinstance(self._client, RedisCluster)
        if confirm is not None and not cluster and self.replicas.stale():
            self.replicas.note(self._client.execute_command("ROLE"))  # type: ignore[no-untyped-call]
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            if isinstance(command, ScriptCall):
                self.run(command, pipe)
            else:
                pipe.execute_command(*command)
        if confirm is not None and not cluster:
            for extra in self.replicas.commands(confirm.keys[0]):
                pipe.execute_command(*extra)
        replies = pipe.execute() if commands or (confirm is not None and not cluster) else []
        if confirm is not None and cluster:
            confirm_cluster(
                cast(RedisCluster, self._client), confirm.keys, self.replicas, confirm.what
            )
        elif confirm is not None:
            self.replicas.check(replies, confirm.what)
            replies = replies[:-CONFIRM_REPLIES]
        return replies

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

    def __init__(
        self, client: redis.asyncio.Redis | AsyncRedisCluster, replicas: Replicas = NO_REPLICAS
    ) -> None:
        self._client = client
        self.replicas = replicas
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

    async def send(
        self, commands: Sequence[ScriptCall | tuple[Any, ...]], confirm: Confirm | None = None
    ) -> list[Any]:
        """The asyncio twin of ``Scripts.send``."""
        confirm = confirm if self.replicas.wanted and confirm and confirm.keys else None
        try:
            return await self._send(commands, confirm)
        except NoScriptError:
            await self._load()
            return await self._send(commands, confirm)
        except UNREACHABLE:
            self.replicas.forget()
            await refresh_async(self._client)
            raise

    async def _send(
        self, commands: Sequence[ScriptCall | tuple[Any, ...]], confirm: Confirm | None
    ) -> list[Any]:
        if not commands and confirm is None:
            return []
        cluster = isinstance(self._client, AsyncRedisCluster)
        if confirm is not None and not cluster and self.replicas.stale():
            self.replicas.note(await self._client.execute_command("ROLE"))
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            if isinstance(command, ScriptCall):
                await self.run(command, pipe)
            else:
                pipe.execute_command(*command)
        if confirm is not None and not cluster:
            for extra in self.replicas.commands(confirm.keys[0]):
                pipe.execute_command(*extra)
        queued = commands or (confirm is not None and not cluster)
        replies = await pipe.execute() if queued else []
        if confirm is not None and cluster:
            client = cast(AsyncRedisCluster, self._client)
            await confirm_cluster_async(client, confirm.keys, self.replicas, confirm.what)
        elif confirm is not None:
            self.replicas.check(replies, confirm.what)
            replies = replies[:-CONFIRM_REPLIES]
        return replies

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
