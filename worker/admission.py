"""A claimed request as the engine takes it: its prompt tokenized, what earlier
attempts published taken back, its adapter looked up in the registry."""

from __future__ import annotations

import time
from typing import Any, Protocol

import redis

from shared.keys import Keys
from shared.loras import get_lora
from shared.models import GenerationRequest, TokenEvent
from shared.records import stream_event
from worker.engine.request import EngineRequest, LoraRef
from worker.held import Held


class Encoder(Protocol):
    def encode_prompt(self, prompt: str) -> list[int]: ...
    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]: ...


def engine_request(
    encoder: Encoder, connection: redis.Redis, keys: Keys, model: str, held: Held
) -> EngineRequest:
    """Raises when the tokenizer, its chat template or the adapter registry refuses it."""
    req = held.request
    if req.messages is not None:
        ids = encoder.encode_chat([m.model_dump() for m in req.messages])
    else:
        ids = encoder.encode_prompt(req.prompt or "")
    held.num_prompt_tokens = len(ids)
    deadline = None if req.deadline_ms is None else req.deadline_ms / 1000
    return EngineRequest(
        request_id=held.request_id,
        prompt_token_ids=ids,
        sampling=req.sampling,
        priority=req.priority,
        arrival=time.monotonic(),
        output_token_ids=list(held.token_ids),
        output_text="".join(held.text_parts),
        deadline_unix_s=deadline,
        task=req.task,
        dimensions=req.dimensions,
        lora=lora_ref(connection, keys, model, req),
    )


def lora_ref(
    connection: redis.Redis, keys: Keys, model: str, req: GenerationRequest
) -> LoraRef | None:
    """Where the request's adapter is, read from the registry when it is claimed."""
    if req.lora is None:
        return None
    adapter = get_lora(connection, keys, model, req.lora)
    if adapter is None:
        raise ValueError(f"LoRA adapter {req.lora!r} is no longer registered for model {model!r}")
    return LoraRef(adapter.name, adapter.path)


def restore(connection: redis.Redis, keys: Keys, held: Held) -> None:
    """Take back what earlier attempts published, so generation resumes after it."""
    entries: Any = connection.xrange(keys.stream(held.request_id))
    for entry_id, fields in entries:
        event = stream_event(entry_id, fields).event
        if isinstance(event, TokenEvent):
            held.record(list(event.token_ids), event.text)
