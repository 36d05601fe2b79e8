"""The LoRA adapter registry: per base model, a hash of adapter name -> LoraAdapter.

Operators write it (CLI, the gateway's admin routes, the dashboard); enqueue.lua
refuses a request naming an adapter that is not in it; workers read an adapter's
path from it when a request needs the adapter. The sync and asyncio twins share
the key and the decoding.
"""

from __future__ import annotations

import re
import time
from typing import Any

import redis
import redis.asyncio

from shared.errors import InvalidRequest
from shared.keys import Keys, model_tag
from shared.models import LORA_NAME_PATTERN, LoraAdapter
from shared.replies import text

_LORA_NAME_RE = re.compile(LORA_NAME_PATTERN)


def split_model(name: str) -> tuple[str, str] | None:
    """``"base:adapter"`` (as vLLM names an adapter on the OpenAI routes) as
    ``(base, adapter)``; None when ``name`` has no adapter part."""
    base, sep, adapter = name.rpartition(":")
    if not sep or not base or not _LORA_NAME_RE.match(adapter):
        return None
    return base, adapter


def new_adapter(model: str, name: str, path: str) -> LoraAdapter:
    """A validated registry record; InvalidRequest saying which field was wrong."""
    try:
        return LoraAdapter(name=name, model=model, path=path, registered_ms=_now_ms())
    except ValueError as e:
        details = "; ".join(
            f"{'.'.join(str(p) for p in item['loc'])}: {item['msg']}"
            for item in getattr(e, "errors", lambda: [])()
        )
        raise InvalidRequest(f"invalid LoRA adapter: {details or e}") from e


def _key(keys: Keys, model: str) -> str:
    return keys.loras(model_tag(model))


def _decode(raw: Any) -> LoraAdapter | None:
    return None if raw is None else LoraAdapter.model_validate_json(text(raw))


def _decode_all(raw: dict[Any, Any]) -> list[LoraAdapter]:
    adapters = [LoraAdapter.model_validate_json(text(v)) for v in raw.values()]
    return sorted(adapters, key=lambda a: a.name)


def register_lora(connection: redis.Redis, keys: Keys, adapter: LoraAdapter) -> bool:
    """Add or replace ``adapter``; True when the name was new for its model."""
    added: Any = connection.hset(_key(keys, adapter.model), adapter.name, adapter.model_dump_json())
    return bool(added)


def remove_lora(connection: redis.Redis, keys: Keys, model: str, name: str) -> bool:
    """Unregister; False when no such adapter was registered. Requests already queued
    with it end with an error when a worker reaches them."""
    removed: Any = connection.hdel(_key(keys, model), name)
    return bool(removed)


def get_lora(connection: redis.Redis, keys: Keys, model: str, name: str) -> LoraAdapter | None:
    return _decode(connection.hget(_key(keys, model), name))


def list_loras(connection: redis.Redis, keys: Keys, model: str) -> list[LoraAdapter]:
    raw: Any = connection.hgetall(_key(keys, model))
    return _decode_all(raw)


async def register_lora_async(
    connection: redis.asyncio.Redis, keys: Keys, adapter: LoraAdapter
) -> bool:
    key = _key(keys, adapter.model)
    return bool(await connection.hset(key, adapter.name, adapter.model_dump_json()))


async def remove_lora_async(
    connection: redis.asyncio.Redis, keys: Keys, model: str, name: str
) -> bool:
    return bool(await connection.hdel(_key(keys, model), name))


async def list_loras_async(
    connection: redis.asyncio.Redis, keys: Keys, models: list[str]
) -> dict[str, list[LoraAdapter]]:
    """Each model's adapters (models with none are left out), in one round trip."""
    pipe = connection.pipeline(transaction=False)
    for model in models:
        pipe.hgetall(_key(keys, model))
    replies = await pipe.execute()
    found = {model: _decode_all(raw) for model, raw in zip(models, replies, strict=True)}
    return {model: adapters for model, adapters in found.items() if adapters}


def _now_ms() -> int:
    return int(time.time() * 1000)
