"""OpenAI-style bodies to tokenq GenerationRequests (field names kept in errors), for the
gateway's routes and batch lines alike."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from producer.openai.errors import from_validation_errors, invalid
from producer.openai.prompt_scores import check_scoring, completion_sampling
from producer.openai.reasoning import ReasoningPlan
from producer.openai.schemas import (
    MAX_DEADLINE_S,
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    GenerationBody,
    NamedToolChoice,
    ResponseFormat,
)
from producer.openai.tool_grammar import Think, json_after_thinking
from producer.openai.tools import (
    ToolError,
    ToolPlan,
    calls_as_text,
    parsed_arguments,
    plan_tools,
    tool_result_text,
    with_tool_prompt,
)
from producer.requests import choice_requests
from shared.chat import ChatFeatures
from shared.guided import UnsupportedSchema, check_json_schema, closed_schema, strict_schema
from shared.models import MAX_N, OPENAI_PASSTHROUGH_SAMPLING, GenerationRequest

# The most requests one completions call makes (its prompts times n).
MAX_CHOICES = 256


@dataclass(frozen=True)
class Origin:
    """The priority a body runs at (the gateway checks the body's priority against the
    caller's API key; a batch sets its own). Who sends it is the submit path's to say
    (``producer.submit``)."""

    priority: int


@dataclass(frozen=True)
class ChatPlan:
    """A chat body as tokenq runs it: the request (one per choice), its tools, and how to
    read the model's reasoning (None for a model without think tags)."""

    requests: list[GenerationRequest]
    tools: ToolPlan
    reasoning: ReasoningPlan | None = None


def chat_request(
    body: ChatCompletionRequest, origin: Origin, features: ChatFeatures | None = None
) -> ChatPlan:
    """The requests for ``body``, on a model whose chat template does what ``features``
    say (registered by its workers; None: a plain template, tools by the fallback prompt)."""
    _check_common(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    sampling = _sampling(body, max_tokens, logprobs)
    features = features or ChatFeatures()
    kwargs = _template_kwargs(body)
    reasoning = reasoning_plan(features, kwargs)
    tools = _tool_plan(body, features)
    think = None if reasoning is None else Think(reasoning.start, reasoning.end, reasoning.opened)
    _add_guide(sampling, _response_schema(body.response_format), tools.guide(think), think)
    messages = [to_prompt_message(m, tools.native) for m in body.messages]
    inputs = {
        "messages": with_tool_prompt(messages, tools),
        "tools": tools.template_tools(),
        "chat_template_kwargs": kwargs,
    }
    gen = _build(body, origin, inputs, sampling, body.metadata)
    return ChatPlan(choice_requests(gen, body.n), tools, reasoning)


def _template_kwargs(body: ChatCompletionRequest) -> dict[str, Any] | None:
    kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", body.reasoning_effort)
    return kwargs or None


def reasoning_plan(
    features: ChatFeatures, kwargs: Mapping[str, Any] | None
) -> ReasoningPlan | None:
    """How to read the reasoning of a model with think tags; None when it has none, or
    when the request turns thinking off (Qwen3's ``enable_thinking``, DeepSeek's
    ``thinking``): its template then closes the block in the prompt."""
    kwargs = kwargs or {}
    if features.think is None or False in (kwargs.get("enable_thinking"), kwargs.get("thinking")):
        return None
    start, end = features.think
    return ReasoningPlan(start, end, features.think_open)


def _tool_plan(body: ChatCompletionRequest, features: ChatFeatures) -> ToolPlan:
    tools = [t.model_dump() for t in body.tools] if body.tools else None
    choice: object = body.tool_choice
    if isinstance(body.tool_choice, NamedToolChoice):
        choice = body.tool_choice.model_dump()
    try:
        return plan_tools(tools, choice, body.parallel_tool_calls, features.tool_format or "json")
    except ToolError as e:
        raise invalid(str(e), e.param) from e


def _response_schema(response_format: ResponseFormat | None) -> dict[str, Any] | None:
    """The schema the answer is decoded to: a strict one as OpenAI's strict mode reads it
    (every property, no other), any other closed where it is silent (as vLLM's)."""
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
    return strict_schema(schema) if response_format.json_schema.strict else closed_schema(schema)


def _add_guide(
    sampling: dict[str, Any],
    schema: dict[str, Any] | None,
    tool_guide: dict[str, Any] | None,
    think: Think | None = None,
) -> None:
    """The one sampling guide of the body; a reasoning model's response format waits for
    the end of its reasoning, as vLLM's does."""
    guides = [
        name
        for name, on in (
            ("response_format", schema is not None),
            ("tool_choice", tool_guide is not None),
            ("guided_json", "guided_json" in sampling),
            ("guided_regex", "guided_regex" in sampling),
        )
        if on
    ]
    if len(guides) > 1:
        message = f"{guides[1]}: cannot be combined with {guides[0]}; give one of them"
        raise invalid(message, guides[1])
    if schema is not None and think is not None:
        sampling["guided_structural_tag"] = json_after_thinking(schema, think)
    elif schema is not None:
        sampling["guided_json"] = schema
    sampling.update(tool_guide or {})


def completion_request(body: CompletionRequest, origin: Origin) -> list[GenerationRequest]:
    """One request per prompt (a text or token ids); a prompt's n choices are the caller's."""
    _check_common(body)
    if body.best_of not in (None, 1):
        raise invalid("only best_of=1 is supported", "best_of", "unsupported")
    if body.suffix:
        raise invalid("suffix is not supported", "suffix", "unsupported")
    sampling = _sampling(body, body.max_tokens, body.logprobs)
    prompts = _prompts(body.prompt)
    if len(prompts) * body.n > MAX_CHOICES:
        message = (
            f"prompt: {len(prompts)} prompts of n={body.n} choices are more than {MAX_CHOICES}"
        )
        raise invalid(message + "; send fewer at a time", "prompt")
    return [_build(body, origin, p, completion_sampling(body, p, sampling), None) for p in prompts]


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[dict[str, Any]]:
    """Each prompt as a request's input: a text, or token ids."""
    if isinstance(prompt, str):
        return [{"prompt": prompt}]
    if not prompt:
        raise invalid(
            "prompt: give a text, token ids, or a list of them (not an empty list)", "prompt"
        )
    if all(isinstance(p, int) for p in prompt):
        return [{"prompt_token_ids": prompt}]
    return [{"prompt_token_ids": p} if isinstance(p, list) else {"prompt": p} for p in prompt]


def _check_common(body: GenerationBody) -> None:
    if not 1 <= body.n <= MAX_N:
        raise invalid(f"n: must be from 1 to {MAX_N} (got {body.n})", "n")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options needs stream: true", "stream_options")
    check_scoring(body)


def to_prompt_message(message: ChatMessageIn, native: bool = False) -> dict[str, Any]:
    """One message as the chat template sees it: with ``native`` tools, calls and results
    as the template renders them; else as text in the fallback prompt's shape."""
    role = "system" if message.role == "developer" else message.role
    content = message.content or ""
    text = content if isinstance(content, str) else "".join(p.text for p in content)
    if native:
        return _native_message(role, text, message)
    if message.tool_calls:
        calls = calls_as_text([c.model_dump() for c in message.tool_calls])
        text = f"{text}\n{calls}" if text else calls
    if role == "tool":
        text = tool_result_text(text, message.tool_call_id)
    return {"role": role, "content": text}


def _native_message(role: str, text: str, message: ChatMessageIn) -> dict[str, Any]:
    out: dict[str, Any] = {"role": role, "content": text}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "name": c.function.name,
                "arguments": parsed_arguments(c.function.arguments),
            }
            for c in message.tool_calls
        ]
    if role == "tool" and message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    return out


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
        "metadata": {**(metadata or {}), **extra},
        "cache_salt": body.cache_salt,
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
