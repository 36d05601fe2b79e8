"""Anthropic Messages API request bodies (the subset tokenq serves), as the ``anthropic``
SDK sends them. Unknown fields are refused with 400 naming them; ``cache_control`` is
accepted and ignored (a worker's prefix cache needs no marks). tokenq's own fields
(``priority``, ``deadline``, ``idempotency_key``) ride along as extra body fields."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from producer.openai.schemas import QueueFields


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cache_control: dict[str, Any] | None = None


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list[dict[str, Any]] | None = None


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=64)
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[TextBlock] = ""
    is_error: bool | None = None


class ThinkingBlock(_Block):
    """An earlier answer's reasoning, sent back; chat templates leave it out."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str


class UnsupportedBlock(BaseModel):
    """A block a text model cannot read (image, document...): refused by name."""

    model_config = ConfigDict(extra="allow")
    type: Literal["image", "document", "search_result", "server_tool_use"]


Block = Annotated[
    TextBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | UnsupportedBlock,
    Field(discriminator="type"),
]


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["custom"] | None = None
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = None


class Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: str | None = Field(None, max_length=256)


class CountTokensRequest(QueueFields):
    """``/v1/messages/count_tokens``: the prompt part of a messages body."""

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    cache_control: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    """``/v1/messages``. ``max_tokens`` is required, as Anthropic's API requires it."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = Field(
        None, description="accepted and ignored (tokenq's priority is its own field)"
    )
