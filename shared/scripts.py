"""Typed wrappers for the Lua scripts in ``shared/lua``.

Each operation is built as a ``ScriptCall`` (script name, KEYS, ARGV) by a pure
function and its reply parsed by another, so the sync and asyncio clients and the
worker share one definition and differ only in how they send it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis
import redis.asyncio

from shared.errors import QueueFull, UnknownModel
from shared.keys import Keys, model_tag, tag_of
from shared.models import GenerationRequest, dumps
from shared.priority import lua_constants
from shared.replies import text
from shared.settings import Settings

SCRIPT_NAMES = (
    "enqueue",
    "claim",
    "publish",
    "finish",
    "cancel",
    "renew",
    "reap",
    "release",
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

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._by_name = {n: client.register_script(load_source(n)) for n in SCRIPT_NAMES}
        self._loaded = False

    def run(self, call: ScriptCall, pipe: redis.client.Pipeline | None = None) -> Any:
        if not self._loaded:
            self._load()
        return self._by_name[call.script](keys=call.keys, args=call.args, client=pipe)

    def _load(self) -> None:
        # Load every script before the first EVALSHA rather than on a NOSCRIPT reply:
        # fakeredis's TCP server (the fallback of `tokenq up`) drops the connection on
        # that error. After a Redis restart redis-py reloads on NOSCRIPT by itself.
        pipe = self._client.pipeline(transaction=False)
        for script in self._by_name.values():
            pipe.script_load(script.script)
        pipe.execute()
        self._loaded = True


class AsyncScripts:
    """The scripts registered on one asyncio connection."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._client = client
        self._by_name = {n: client.register_script(load_source(n)) for n in SCRIPT_NAMES}
        self._loaded = False

    async def run(self, call: ScriptCall, pipe: redis.asyncio.client.Pipeline | None = None) -> Any:
        if not self._loaded:
            await self._load()
        return await self._by_name[call.script](keys=call.keys, args=call.args, client=pipe)

    async def _load(self) -> None:
        pipe = self._client.pipeline(transaction=False)
        for script in self._by_name.values():
            pipe.script_load(script.script)
        await pipe.execute()
        self._loaded = True


@dataclass(frozen=True)
class Enqueued:
    request_id: str
    duplicate: bool


@dataclass(frozen=True)
class Claimed:
    request_id: str
    lease_token: str
    payload: str
    attempts: int
    num_generated: int


def enqueue_call(
    keys: Keys, settings: Settings, request_id: str, req: GenerationRequest
) -> ScriptCall:
    tag = model_tag(req.model)
    idem = req.idempotency_key or ""
    return ScriptCall(
        "enqueue",
        [
            keys.queue(tag),
            keys.seq(tag),
            keys.request(request_id),
            keys.idempotency(tag, idem, req.tenant),
            keys.wakeup(tag),
            keys.deadlines(tag),
            keys.served(tag),
        ],
        [
            request_id,
            dumps(req).decode(),
            int(req.priority),
            settings.max_queued,
            settings.idempotency_ttl_s,
            idem,
            "" if req.deadline_ms is None else req.deadline_ms,
            req.model,
            keys.lifecycle_channel(),
            "1" if settings.require_known_model else "0",
            req.tenant or "",
        ],
    )


def parse_enqueue(reply: list[Any], model: str, settings: Settings) -> Enqueued:
    status, value = text(reply[0]), text(reply[1])
    if status == "full":
        raise QueueFull(model, settings.max_queued)
    if status == "unknown_model":
        raise UnknownModel(model)
    return Enqueued(request_id=value, duplicate=status == "duplicate")


def claim_call(
    keys: Keys, settings: Settings, tag: str, worker_id: str, ids: list[str]
) -> ScriptCall:
    per_request = [k for rid in ids for k in (keys.request(rid), keys.stream(rid))]
    return ScriptCall(
        "claim",
        [
            keys.queue(tag),
            keys.leases(tag),
            keys.owners(tag),
            keys.deadlines(tag),
            keys.recent(tag),
            keys.failed(tag),
            *per_request,
        ],
        [worker_id, settings.lease_ms, settings.result_ttl_s, keys.lifecycle_channel(), *ids],
    )


def parse_claim(reply: list[Any]) -> list[Claimed]:
    rows = [reply[i : i + 5] for i in range(0, len(reply), 5)]
    return [Claimed(text(r[0]), text(r[1]), text(r[2]), int(r[3]), int(r[4])) for r in rows]


@dataclass(frozen=True)
class TokenPublish:
    """One request's token event within a step."""

    request_id: str
    lease_token: str
    event_json: bytes
    index: int
    num_tokens: int


def publish_call(keys: Keys, events: list[TokenPublish]) -> ScriptCall:
    """All of a step's token events in one script call (one reply code per event)."""
    tags = {tag_of(e.request_id) for e in events}
    if len(tags) != 1:
        raise ValueError("one publish call serves one model queue")
    per_event = [k for e in events for k in (keys.request(e.request_id), keys.stream(e.request_id))]
    args = [
        a
        for e in events
        for a in (e.request_id, e.lease_token, e.event_json.decode(), e.num_tokens, e.index)
    ]
    return ScriptCall("publish", [keys.owners(tags.pop()), *per_event], args)


def finish_call(
    keys: Keys,
    settings: Settings,
    request_id: str,
    token: str,
    final_json: bytes,
    output_json: bytes,
    state: str,
) -> ScriptCall:
    tag = tag_of(request_id)
    return ScriptCall(
        "finish",
        [
            keys.owners(tag),
            keys.leases(tag),
            keys.request(request_id),
            keys.stream(request_id),
            keys.dead(tag),
            keys.deadlines(tag),
            keys.recent(tag),
            keys.failed(tag),
        ],
        [
            request_id,
            token,
            final_json.decode(),
            output_json.decode(),
            state,
            settings.result_ttl_s,
            keys.lifecycle_channel(),
        ],
    )


def cancel_call(keys: Keys, settings: Settings, request_id: str) -> ScriptCall:
    tag = tag_of(request_id)
    return ScriptCall(
        "cancel",
        [
            keys.queue(tag),
            keys.request(request_id),
            keys.stream(request_id),
            keys.deadlines(tag),
            keys.recent(tag),
            keys.failed(tag),
        ],
        [request_id, settings.result_ttl_s, keys.lifecycle_channel()],
    )


def renew_call(keys: Keys, settings: Settings, tag: str, held: dict[str, str]) -> ScriptCall:
    pairs = [x for item in held.items() for x in item]
    return ScriptCall(
        "renew",
        [keys.leases(tag), keys.owners(tag), *(keys.request(rid) for rid in held)],
        [settings.lease_ms, *pairs],
    )


@dataclass(frozen=True)
class Reaped:
    requeued: int = 0
    dead: int = 0
    ended: int = 0  # expired while queued, or cancelled while its worker died


def reap_call(keys: Keys, settings: Settings, tag: str, ids: list[str]) -> ScriptCall:
    per_request = [k for rid in ids for k in (keys.request(rid), keys.stream(rid))]
    return ScriptCall(
        "reap",
        [
            keys.leases(tag),
            keys.owners(tag),
            keys.queue(tag),
            keys.dead(tag),
            keys.deadlines(tag),
            keys.wakeup(tag),
            keys.recent(tag),
            keys.failed(tag),
            *per_request,
        ],
        [
            settings.max_attempts,
            settings.result_ttl_s,
            keys.lifecycle_channel(),
            *ids,
        ],
    )


def parse_reap(reply: list[Any]) -> Reaped:
    return Reaped(*(int(x) for x in reply))


def release_call(keys: Keys, tag: str, held: dict[str, str]) -> ScriptCall:
    pairs = [x for item in held.items() for x in item]
    return ScriptCall(
        "release",
        [
            keys.leases(tag),
            keys.owners(tag),
            keys.queue(tag),
            keys.wakeup(tag),
            *(keys.request(rid) for rid in held),
        ],
        [keys.lifecycle_channel(), *pairs],
    )


def retry_call(keys: Keys, request_id: str) -> ScriptCall:
    tag = tag_of(request_id)
    return ScriptCall(
        "retry",
        [
            keys.dead(tag),
            keys.queue(tag),
            keys.seq(tag),
            keys.request(request_id),
            keys.stream(request_id),
            keys.wakeup(tag),
        ],
        [request_id, keys.lifecycle_channel()],
    )
