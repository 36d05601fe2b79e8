"""OpenAI-style bodies to tokenq GenerationRequests (field names kept in errors), for the
gateway's routes and batch lines alike."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from producer.openai.errors import from_validation_errors, invalid
from producer.openai.schemas import (
    MAX_DEADLINE_S,
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    GenerationBody,
    NamedToolChoice,
    ResponseFormat,
)
from producer.openai.tools import (
    ToolError,
    ToolPlan,
    calls_as_text,
    plan_tools,
    tool_result_text,
    with_tool_prompt,
)
from producer.requests import choice_requests
from shared.guided import UnsupportedSchema, check_json_schema
from shared.models import MAX_N, OPENAI_PASSTHROUGH_SAMPLING, TENANT, GenerationRequest


@dataclass(frozen=True)
class Origin:
    """Who sends a body, and the priority it runs at (the gateway checks the body's
    priority against the caller's API key; a batch sets its own)."""

    tenant: str | None
    priority: int


@dataclass(frozen=True)
class ChatPlan:
    """A chat body as tokenq runs it: the request (one per choice) and its tools."""

    requests: list[GenerationRequest]
    tools: ToolPlan


def chat_request(body: ChatCompletionRequest, origin: Origin) -> ChatPlan:
    _check_common(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    sampling = _sampling(body, max_tokens, logprobs)
    tools = _tool_plan(body)
    _add_guide(sampling, _response_schema(body.response_format), tools)
    messages = with_tool_prompt([to_prompt_message(m) for m in body.messages], tools)
    gen = _build(body, origin, {"messages": messages}, sampling, body.metadata)
    return ChatPlan(choice_requests(gen, body.n), tools)


def _tool_plan(body: ChatCompletionRequest) -> ToolPlan:
    tools = [t.model_dump() for t in body.tools] if body.tools else None
    choice: object = body.tool_choice
    if isinstance(body.tool_choice, NamedToolChoice):
        choice = body.tool_choice.model_dump()
    try:
        return plan_tools(tools, choice, body.parallel_tool_calls)
    except ToolError as e:
        raise invalid(str(e), e.param) from e


def _response_schema(response_format: ResponseFormat | None) -> dict[str, Any] | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return {"type": "object"}
    if response_format.json_schema is None:
        raise invalid("response_format: json_schema needs its json_schema", "response_format")
    schema = response_format.json_schema.schema_
    try:
        check_json_schema(schema)
    except UnsupportedSchema as e:
        param = "response_format.json_schema.schema"
        raise invalid(f"{param}: {e}", param, "unsupported") from e
    return schema


def _add_guide(sampling: dict[str, Any], schema: dict[str, Any] | None, tools: ToolPlan) -> None:
    guides = [
        name
        for name, on in (
            ("response_format", schema is not None),
            ("tool_choice", tools.schema() is not None),
            ("guided_json", "guided_json" in sampling),
            ("guided_regex", "guided_regex" in sampling),
        )
        if on
    ]
    if len(guides) > 1:
        message = f"{guides[1]}: cannot be combined with {guides[0]}; give one of them"
        raise invalid(message, guides[1])
    if schema is not None or tools.schema() is not None:
        sampling["guided_json"] = schema if schema is not None else tools.schema()


def completion_request(body: CompletionRequest, origin: Origin) -> GenerationRequest:
    _check_common(body)
    if body.echo:
        raise invalid("echo is not supported; prepend the prompt yourself", "echo", "unsupported")
    if body.best_of not in (None, 1):
        raise invalid("only best_of=1 is supported", "best_of", "unsupported")
    if body.suffix:
        raise invalid("suffix is not supported", "suffix", "unsupported")
    sampling = _sampling(body, body.max_tokens, body.logprobs)
    return _build(body, origin, {"prompt": _prompt(body.prompt)}, sampling, None)


def _check_common(body: GenerationBody) -> None:
    if not 1 <= body.n <= MAX_N:
        raise invalid(f"n: must be from 1 to {MAX_N} (got {body.n})", "n")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options needs stream: true", "stream_options")


def to_prompt_message(message: ChatMessageIn) -> dict[str, str]:
    """One message as the chat template sees it; tool calls and results become text."""
    role = "system" if message.role == "developer" else message.role
    content = message.content or ""
    text = content if isinstance(content, str) else "".join(p.text for p in content)
    if message.tool_calls:
        calls = calls_as_text([c.model_dump() for c in message.tool_calls])
        text = f"{text}\n{calls}" if text else calls
    if role == "tool":
        text = tool_result_text(text, message.tool_call_id)
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
    origin: Origin,
    inputs: dict[str, Any],
    sampling: dict[str, Any],
    metadata: dict[str, str] | None,
) -> GenerationRequest:
    extra = {"user": body.user} if body.user else {}
    data = {
        "model": body.model,
        **inputs,
        "sampling": sampling,
        "priority": origin.priority,
        "deadline_ms": deadline_ms(body.deadline),
        "idempotency_key": body.idempotency_key,
        "metadata": {**(metadata or {}), **extra, **tenant_metadata(origin)},
    }
    try:
        return GenerationRequest.model_validate(data)
    except ValidationError as e:
        raise from_validation_errors(e.errors(), strip=("sampling",)) from e


def tenant_metadata(origin: Origin) -> dict[str, str]:
    return {} if origin.tenant is None else {TENANT: origin.tenant}


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
