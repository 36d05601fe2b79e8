"""A claimed request as the engine takes it: its prompt as tokens (token ids checked, a
text tokenized, chat messages and tools through the chat template), what earlier
attempts published taken back, its adapter looked up in the registry."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from shared.cache_scope import cache_salt
from shared.models import FunctionSpec, GenerationRequest
from shared.refusal import invalid
from worker.engine.request import EngineRequest, LoraRef
from worker.held import Held
from worker.prefix_cuts import Encoder as TextEncoder
from worker.prefix_cuts import PrefixCuts
from worker.queue import ModelQueue


class Encoder(TextEncoder, Protocol):
    """The engine's encoding, as admission needs it: the prefix cuts' and the vocabulary."""

    @property
    def vocab_size(self) -> int: ...


def engine_request(
    encoder: Encoder, queue: ModelQueue, held: Held, cuts: PrefixCuts | None = None
) -> EngineRequest:
    """Raises when the tokenizer, its chat template or the adapter registry refuses it.
    ``cuts`` maps its prefix fingerprints to its tokens (prefix affinity)."""
    req = held.request
    ids = prompt_token_ids(encoder, req)
    held.num_prompt_tokens = len(ids)
    deadline = None if req.deadline_ms is None else req.deadline_ms / 1000
    salt = cache_salt(req, queue.settings)
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
        lora=lora_ref(queue, req),
        cache_salt=salt,
        prefix_cuts=() if cuts is None else cuts.of(req, ids, salt),
    )


def prompt_token_ids(encoder: Encoder, req: GenerationRequest) -> list[int]:
    """The prompt as tokens: token ids as given (checked against the vocabulary), a
    text tokenized, or chat messages (and tools) through the chat template."""
    if req.prompt_token_ids is not None:
        return checked_token_ids(req.prompt_token_ids, encoder.vocab_size)
    if req.messages is None:
        return encoder.encode_prompt(req.prompt or "")
    messages = [m.template_view() for m in req.messages]
    tools = None if req.tools is None else [_template_tool(t) for t in req.tools]
    return encoder.encode_chat(messages, tools, req.chat_template_kwargs)


def _template_tool(function: FunctionSpec) -> dict[str, Any]:
    return {"type": "function", "function": function.model_dump()}


def checked_token_ids(token_ids: Sequence[int], vocab_size: int) -> list[int]:
    """``token_ids`` when every one is in the vocabulary; RequestRefused naming the first
    that is not (the wire schema has already refused negative ones)."""
    if not token_ids or max(token_ids) < vocab_size:
        return list(token_ids)
    for at, token_id in enumerate(token_ids):
        if token_id >= vocab_size:
            raise invalid(
                "prompt_token_ids",
                f"prompt_token_ids[{at}] is {token_id}, outside the model's vocabulary of "
                f"{vocab_size} tokens (ids 0..{vocab_size - 1})",
            )
    return list(token_ids)  # not reached: the max was out of range


def lora_ref(queue: ModelQueue, req: GenerationRequest) -> LoraRef | None:
    """Where the request's adapter is, read from the registry when it is claimed."""
    if req.lora is None:
        return None
    adapter = queue.lora(req.lora)
    if adapter is None:
        raise invalid(
            "lora", f"LoRA adapter {req.lora!r} is no longer registered for model {queue.model!r}"
        )
    return LoraRef(adapter.name, adapter.path)


def restore(queue: ModelQueue, held: Held) -> None:
    """Take back what earlier attempts published, so generation resumes after it."""
    for event in queue.published(held.request_id):
        held.record(list(event.token_ids), event.text)
