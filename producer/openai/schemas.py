"""OpenAI-compatible request and response bodies (the subset tokenq serves).

tokenq's own fields ride along as extra body fields, as vLLM's do: priority,
deadline, idempotency_key, top_k, min_p, min_tokens, repetition_penalty, ignore_eos,
speculative, stop_token_ids, guided_json, guided_regex, cache_salt. Unknown fields are
refused with 400 naming them, rather than ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, ConfigDict, Field

from shared.models import MAX_CACHE_SALT_CHARS, MAX_N, SamplingParams

MAX_DEADLINE_S = 366 * 24 * 3600
PRIORITY_DOC = "tokenq: low, normal, high, critical or 0..100 (higher runs first)"
CACHE_SALT_DOC = (
    "vLLM's: only requests with the same salt (and of the same tenant) share cached "
    f"prefixes; 1 to {MAX_CACHE_SALT_CHARS} printable characters"
)
_BOUNDS = {
    annotated_types.Ge: "minimum",
    annotated_types.Gt: "exclusiveMinimum",
    annotated_types.Le: "maximum",
    annotated_types.Lt: "exclusiveMaximum",
    annotated_types.MaxLen: "maxItems",
}


def sampling_bounds(name: str) -> dict[str, Any]:
    """The JSON Schema bounds of a SamplingParams field, so the schema documents the limits
    that validation (in GenerationRequest, the one place for them) enforces."""
    bounds: dict[str, Any] = {}
    for item in SamplingParams.model_fields[name].metadata:
        for kind, keyword in _BOUNDS.items():
            if isinstance(item, kind) and dataclasses.is_dataclass(item):
                bounds[keyword] = getattr(item, dataclasses.fields(item)[0].name)
    return bounds


def _sampled(name: str, doc: str | None = None) -> Any:
    return Field(None, description=doc, json_schema_extra=sampling_bounds(name))


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class QueueFields(BaseModel):
    """tokenq's own fields of every queued OpenAI request (chat, completions, embeddings)."""

    model_config = ConfigDict(extra="forbid")

    priority: int | str | None = Field(None, description=PRIORITY_DOC)
    deadline: float | None = Field(
        None,
        description="tokenq: seconds from now to finish by",
        json_schema_extra={"exclusiveMinimum": 0, "maximum": MAX_DEADLINE_S},
    )
    idempotency_key: str | None = Field(None, description="tokenq: repeat-safe submit key")


class GenerationBody(QueueFields):
    model: str
    max_tokens: int | None = _sampled("max_tokens")
    temperature: float | None = _sampled("temperature")
    top_p: float | None = _sampled("top_p")
    stop: str | list[str] | None = _sampled("stop")
    seed: int | None = _sampled("seed")
    n: int = Field(1, json_schema_extra={"minimum": 1, "maximum": MAX_N})
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    frequency_penalty: float | None = _sampled("frequency_penalty")
    presence_penalty: float | None = _sampled("presence_penalty")
    logit_bias: dict[str, float] | None = Field(
        None, description="token id (as a string) to a bias from -100 to 100"
    )
    top_k: int | None = _sampled("top_k")
    min_p: float | None = _sampled("min_p")
    guided_json: dict[str, Any] | None = Field(None, description="tokenq: a JSON schema to fit")
    guided_regex: str | None = Field(None, description="tokenq: a regex the output matches")
    min_tokens: int | None = _sampled("min_tokens")
    repetition_penalty: float | None = _sampled("repetition_penalty")
    ignore_eos: bool | None = None
    speculative: bool | None = Field(
        None, description="tokenq: false keeps this request out of speculative decoding"
    )
    stop_token_ids: list[int] | None = _sampled("stop_token_ids")
    prompt_logprobs: int | None = _sampled(
        "prompt_logprobs", "vLLM: each prompt token's logprob and this many alternatives"
    )
    cache_salt: str | None = Field(
        None, description=CACHE_SALT_DOC, json_schema_extra={"maxLength": MAX_CACHE_SALT_CHARS}
    )


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="the arguments as a JSON object in a string")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    # An earlier answer's reasoning, as clients send it back; templates leave it out.
    reasoning_content: str | None = None
    reasoning: str | None = None


class JsonSchemaFormat(BaseModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionDef(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(GenerationBody):
    messages: list[ChatMessageIn]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = _sampled("logprobs")
    metadata: dict[str, str] | None = None
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="variables for the model's chat template, e.g. {'enable_thinking': false}"
    )
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = Field(
        None, description="passed to the chat template as reasoning_effort (gpt-oss reads it)"
    )


class CompletionRequest(GenerationBody):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text, a list of token ids, or a list of either (one completion each)"
    )
    logprobs: int | None = _sampled("logprobs")
    echo: bool = Field(False, description="the prompt before the completion (not streamed)")
    best_of: int | None = None
    suffix: str | None = None
