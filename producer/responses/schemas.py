"""The body of ``POST /v1/responses`` (the subset tokenq serves), with tokenq's own
fields (priority, deadline, idempotency_key, chat_template_kwargs, and the sampling
fields the chat route takes: seed, top_k, min_p, min_tokens, repetition_penalty,
ignore_eos, stop) as extra fields.

Input items are checked one by one in ``inputs`` (so an error names ``input.3.content.0``
and says what to send instead). Fields OpenAI clients send that change nothing here are
accepted (``include``, ``user``, ``service_tier``, ...); fields tokenq cannot honour are
refused by name rather than ignored; any other unknown field answers 400.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from producer.openai.schemas import QueueFields, sampling_bounds
from producer.responses.inputs import MAX_INPUT_ITEMS

MAX_METADATA_ITEMS = 16
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextFormat(_Closed):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, description="json_schema: the schema's name")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Closed):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = Field(
        None, description="accepted; it changes nothing here"
    )


class FunctionTool(_Closed):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = Field(None, description="default true, as OpenAI's")


class FunctionChoice(_Closed):
    type: Literal["function"]
    name: str


class ReasoningConfig(_Closed):
    effort: Effort | None = Field(None, description="reaches the chat template as reasoning_effort")
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(_Closed):
    include_obfuscation: bool | None = None


class ResponsesBody(QueueFields):
    """What ``client.responses.create`` sends."""

    model: str
    input: str | list[dict[str, Any]] = Field(
        description="a text, or a list of items: messages (text parts), function_call, "
        "function_call_output, reasoning",
        json_schema_extra={"maxItems": MAX_INPUT_ITEMS},
    )
    instructions: str | None = Field(None, description="a system message for this response only")
    max_output_tokens: int | None = Field(None, json_schema_extra=sampling_bounds("max_tokens"))
    temperature: float | None = Field(None, json_schema_extra=sampling_bounds("temperature"))
    top_p: float | None = Field(None, json_schema_extra=sampling_bounds("top_p"))
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = Field(None, max_length=MAX_METADATA_ITEMS)
    store: bool = Field(True, description="keep it for GET, previous_response_id and resume")
    previous_response_id: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    background: bool = Field(False, description="answer at once (queued); poll or stream by id")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="tokenq: variables for the model's chat template"
    )
    # tokenq's sampling fields, as on the chat route.
    seed: int | None = Field(None, json_schema_extra=sampling_bounds("seed"))
    top_k: int | None = Field(None, json_schema_extra=sampling_bounds("top_k"))
    min_p: float | None = Field(None, json_schema_extra=sampling_bounds("min_p"))
    min_tokens: int | None = Field(None, json_schema_extra=sampling_bounds("min_tokens"))
    repetition_penalty: float | None = Field(
        None, json_schema_extra=sampling_bounds("repetition_penalty")
    )
    ignore_eos: bool | None = None
    stop: str | list[str] | None = Field(None, json_schema_extra=sampling_bounds("stop"))
    # Accepted, and changing nothing here.
    include: list[str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    # Refused unless left at what tokenq does (see ``plan.UNSUPPORTED``).
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, tools: Any) -> Any:
        for n, tool in enumerate(tools if isinstance(tools, list) else ()):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise ValueError(
                    f"tool {n} is of type {kind!r}: tokenq serves function tools only "
                    "(type 'function'); run other tools yourself and send their results"
                )
        return tools
