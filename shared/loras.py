"""The LoRA adapter registry: per base model, a hash of adapter name -> LoraAdapter.

Operators write it (CLI, the gateway's admin routes, the dashboard); enqueue.lua
refuses a request naming an adapter that is not in it and marks the request with the
adapter's rank, so that only workers that can serve it claim it (claim.lua); workers
read an adapter's path from it when a request needs the adapter. The sync and asyncio
twins share the key and the decoding.
"""

from __future__ import annotations

import json
import re
import struct
import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

from shared.errors import InvalidRequest
from shared.keys import Keys, model_tag
from shared.models import LORA_NAME_PATTERN, LoraAdapter
from shared.replies import text

_LORA_NAME_RE = re.compile(LORA_NAME_PATTERN)
WEIGHTS_FILE = "adapter_model.safetensors"  # in a PEFT directory
# A safetensors header is a JSON table of tensor names, dtypes and shapes; anything
# larger than this is not an adapter's.
_HEADER_MAX_BYTES = 16 * 2**20


def split_model(name: str) -> tuple[str, str] | None:
    """``"base:adapter"`` (as vLLM names an adapter on the OpenAI routes) as
    ``(base, adapter)``; None when ``name`` has no adapter part."""
    base, sep, adapter = name.rpartition(":")
    if not sep or not base or not _LORA_NAME_RE.match(adapter):
        return None
    return base, adapter


def new_adapter(model: str, name: str, path: str, rank: int | None = None) -> LoraAdapter:
    """A validated registry record; InvalidRequest saying which field was wrong. The
    rank is read from the adapter's weights when ``path`` is on this host (a ``rank``
    given too must agree); one only on the workers' hosts needs ``rank``."""
    adapter = _record(name=name, model=model, path=path, registered_ms=_now_ms())
    return _record(**adapter.model_dump(exclude={"rank"}), rank=adapter_rank(path, rank))


def adapter_rank(path: str, given: int | None = None) -> int:
    """The rank of the adapter at ``path``, or ``given`` when this host cannot see it."""
    if given is not None and given < 1:
        raise InvalidRequest(f"invalid LoRA adapter: rank must be at least 1, got {given}")
    if given is not None and not Path(path).exists():
        return given
    rank = read_rank(path)
    if given is not None and given != rank:
        raise InvalidRequest(
            f"the LoRA adapter at {path} has rank {rank}, not {given}: leave the rank out "
            "(it is read from the adapter) or give the right one"
        )
    return rank


def read_rank(path: str) -> int:
    """The largest ``lora_A`` row count in the weights of the adapter at ``path`` (a
    PEFT directory or a .safetensors file), read from the safetensors header alone:
    the rank a worker checks against its --max-lora-rank."""
    where = Path(path)
    weights = where / WEIGHTS_FILE if where.is_dir() else where
    try:
        header = _safetensors_header(weights)
    except (OSError, ValueError) as e:
        raise InvalidRequest(
            f"cannot read the rank of the LoRA adapter at {path}: {e}. Give its rank "
            "(--rank, or 'rank' in the body) when the adapter is only on the workers' hosts"
        ) from e
    ranks = [
        int(info["shape"][0])
        for key, info in header.items()
        if "lora_A" in key and isinstance(info, dict) and len(info.get("shape", ())) == 2
    ]
    if not ranks:
        raise InvalidRequest(f"{weights} holds no LoRA weights (no lora_A tensors)")
    return max(ranks)


def _safetensors_header(file: Path) -> dict[str, Any]:
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{file} is too short to be a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length > _HEADER_MAX_BYTES:
            raise ValueError(f"{file} is not a safetensors file (header of {length} bytes)")
        header = json.loads(f.read(length))
    if not isinstance(header, dict):
        raise ValueError(f"{file} is not a safetensors file (its header is not a table)")
    return header


def _record(**fields: Any) -> LoraAdapter:
    try:
        return LoraAdapter(**fields)
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
