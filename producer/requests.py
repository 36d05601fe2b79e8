"""Building and validating a submit, shared by the sync and asyncio clients."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from shared.errors import InvalidRequest, RequestFailed
from shared.models import ChatMessage, GenerationRequest, MetadataValue, Result
from shared.settings import Settings

Messages = Sequence[ChatMessage | Mapping[str, str]]


def build_request(
    settings: Settings,
    prompt: str | None = None,
    *,
    messages: Messages | None = None,
    prompt_token_ids: Sequence[int] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    model: str | None = None,
    priority: int | str = "normal",
    deadline: float | datetime | None = None,
    idempotency_key: str | None = None,
    metadata: Mapping[str, MetadataValue] | None = None,
    lora: str | None = None,
    cache_salt: str | None = None,
    traceparent: str | None = None,
    **sampling: Any,
) -> GenerationRequest:
    """A validated request from ``submit``'s arguments: one of ``prompt`` (a text),
    ``prompt_token_ids`` (the prompt as token ids, checked against the model's
    vocabulary when it runs) and ``messages`` (with ``chat_template_kwargs`` for the
    chat template, e.g. ``{"enable_thinking": False}``); ``deadline`` is seconds from
    now or an aware datetime; ``lora`` names a LoRA adapter registered for the model;
    ``cache_salt`` keeps its cached prefix apart from requests without the same salt.
    ``traceparent`` is a W3C trace context to trace it under. Raises InvalidRequest
    saying which field was wrong."""
    fields = {
        "model": model or settings.default_model,
        "lora": lora,
        "cache_salt": cache_salt,
        "prompt": prompt,
        "prompt_token_ids": prompt_token_ids,
        "messages": messages,
        "chat_template_kwargs": chat_template_kwargs,
        "priority": priority,
        "sampling": sampling,
        "deadline_ms": _deadline_ms(deadline),
        "idempotency_key": idempotency_key,
        "metadata": dict(metadata or {}),
        "traceparent": traceparent,
    }
    return validate_request(settings, fields)


def build_embed_requests(
    settings: Settings,
    texts: str | Sequence[str],
    *,
    model: str | None = None,
    priority: int | str = "normal",
    dimensions: int | None = None,
    deadline: float | datetime | None = None,
    metadata: Mapping[str, MetadataValue] | None = None,
) -> list[GenerationRequest]:
    """One validated embed request per text (``texts`` may be a single string)."""
    fields = {
        "model": model or settings.default_model,
        "task": "embed",
        "dimensions": dimensions,
        "priority": priority,
        "deadline_ms": _deadline_ms(deadline),
        "metadata": dict(metadata or {}),
    }
    items = [texts] if isinstance(texts, str) else list(texts)
    if not items:
        raise InvalidRequest("texts: give at least one text to embed")
    return [validate_request(settings, {**fields, "prompt": text}) for text in items]


def embedding_of(result: Result) -> list[float]:
    """An embed request's vector; RequestFailed saying why when it has none."""
    if result.embedding is None:
        why = result.error or f"it ended with {result.finish_reason.value}"
        raise RequestFailed(f"request {result.id} produced no embedding: {why}")
    return list(result.embedding)


def choice_requests(gen: GenerationRequest, n: int) -> list[GenerationRequest]:
    """``n`` requests for ``n`` choices: choice i has seed + i and idempotency key #i."""
    if n == 1:
        return [gen]
    seed, key = gen.sampling.seed, gen.idempotency_key
    return [
        gen.model_copy(
            update={
                "sampling": gen.sampling.model_copy(
                    update={"seed": None if seed is None else (seed + i) % 2**63}
                ),
                "idempotency_key": None if key is None else f"{key}#{i}",
            }
        )
        for i in range(n)
    ]


def validate_request(
    settings: Settings, data: GenerationRequest | Mapping[str, Any]
) -> GenerationRequest:
    try:
        req = (
            data if isinstance(data, GenerationRequest) else GenerationRequest.model_validate(data)
        )
    except ValidationError as e:
        raise InvalidRequest(describe_validation_error(e)) from e
    if req.prompt_chars() > settings.max_prompt_chars:
        raise InvalidRequest(
            f"prompt is {req.prompt_chars()} characters, over the limit of "
            f"{settings.max_prompt_chars} (TOKENQ_MAX_PROMPT_CHARS)"
        )
    return req


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem: the field's dotted path and what was wrong with it."""
    lines = []
    for item in error.errors(include_url=False):
        path = ".".join(str(p) for p in item["loc"]) or "request"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = f"unknown field {item['loc'][-1]!r}"
        lines.append(f"{path}: {message}")
    return "invalid request: " + "; ".join(lines)


def _deadline_ms(deadline: float | datetime | None) -> int | None:
    if deadline is None:
        return None
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise InvalidRequest("deadline: use a timezone-aware datetime")
        return int(deadline.timestamp() * 1000)
    if deadline <= 0:
        raise InvalidRequest(f"deadline: must be a positive number of seconds, got {deadline}")
    return int((time.time() + deadline) * 1000)
