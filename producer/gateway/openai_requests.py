"""OpenAI-style bodies to tokenq GenerationRequests (field names kept in errors)."""

from __future__ import annotations

import math
import time
from typing import Any

from pydantic import ValidationError

from producer.gateway.auth import Principal, priority_for
from producer.gateway.errors import from_validation_errors, invalid
from producer.gateway.openai_schemas import (
    MAX_DEADLINE_S,
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    GenerationBody,
)
from shared.models import OPENAI_PASSTHROUGH_SAMPLING, GenerationRequest


def chat_request(body: ChatCompletionRequest, caller: Principal) -> GenerationRequest:
    _check_common(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    sampling = _sampling(body, max_tokens, logprobs)
    messages = [_message(m) for m in body.messages]
    return _build(body, caller, {"messages": messages}, sampling, body.metadata)


def completion_request(body: CompletionRequest, caller: Principal) -> GenerationRequest:
    _check_common(body)
    if body.echo:
        raise invalid("echo is not supported; prepend the prompt yourself", "echo", "unsupported")
    if body.best_of not in (None, 1):
        raise invalid("only best_of=1 is supported", "best_of", "unsupported")
    if body.suffix:
        raise invalid("suffix is not supported", "suffix", "unsupported")
    sampling = _sampling(body, body.max_tokens, body.logprobs)
    return _build(body, caller, {"prompt": _prompt(body.prompt)}, sampling, None)


def _check_common(body: GenerationBody) -> None:
    if body.n != 1:
        raise invalid(
            f"n: only n=1 is supported (got {body.n}); send separate requests", "n", "unsupported"
        )
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(body, name) not in (None, 0):
            raise invalid(f"{name} is not supported; use repetition_penalty", name, "unsupported")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options needs stream: true", "stream_options")


def _message(message: ChatMessageIn) -> dict[str, str]:
    role = "system" if message.role == "developer" else message.role
    content = message.content
    text = content if isinstance(content, str) else "".join(p.text for p in content)
    return {"role": role, "content": text}


def _prompt(prompt: str | list[str]) -> str:
    if isinstance(prompt, str):
        return prompt
    if len(prompt) != 1:
        message = f"prompt: give one prompt, not a list of {len(prompt)}; send one request each"
        raise invalid(message, "prompt", "unsupported")
    return prompt[0]


def _sampling(body: GenerationBody, max_tokens: int | None, logprobs: int | None) -> dict[str, Any]:
    values: dict[str, Any] = {name: getattr(body, name) for name in OPENAI_PASSTHROUGH_SAMPLING}
    values["max_tokens"] = max_tokens
    values["logprobs"] = logprobs
    values["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop
    return {k: v for k, v in values.items() if v is not None}


def _build(
    body: GenerationBody,
    caller: Principal,
    inputs: dict[str, Any],
    sampling: dict[str, Any],
    metadata: dict[str, str] | None,
) -> GenerationRequest:
    extra = {"user": body.user} if body.user else {}
    data = {
        "model": body.model,
        **inputs,
        "sampling": sampling,
        "priority": priority_for(caller, body.priority),
        "deadline_ms": deadline_ms(body.deadline),
        "idempotency_key": body.idempotency_key,
        "metadata": {**(metadata or {}), **extra, "tenant": caller.tenant},
    }
    try:
        return GenerationRequest.model_validate(data)
    except ValidationError as e:
        raise from_validation_errors(e.errors(), strip=("sampling",)) from e


def deadline_ms(deadline_s: float | None, param: str = "deadline") -> int | None:
    """Unix ms ``deadline_s`` seconds from now; a clear 400 for zero, negative or absurd."""
    if deadline_s is None:
        return None
    if not math.isfinite(deadline_s) or not 0 < deadline_s <= MAX_DEADLINE_S:
        raise invalid(
            f"{param}: must be seconds from now, above 0 and at most {MAX_DEADLINE_S} "
            f"(got {deadline_s})",
            param,
        )
    return int((time.time() + deadline_s) * 1000)
