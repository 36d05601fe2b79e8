"""vLLM's ``/tokenize`` and ``/detokenize`` bodies (``vllm.entrypoints.openai.protocol``):
a prompt, or chat messages through the model's chat template, as token ids; token ids
as text. tokenq's ``priority`` rides along as on the other OpenAI routes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from producer.openai.schemas import PRIORITY_DOC, ChatMessageIn, ToolDef


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="the model (default: the gateway's default)")
    priority: int | str | None = Field(None, description=PRIORITY_DOC + "; default high")


class TokenizeRequest(_Body):
    """vLLM's TokenizeCompletionRequest (``prompt``) or TokenizeChatRequest
    (``messages``): give one of them."""

    prompt: str | None = None
    messages: list[ChatMessageIn] | None = None
    add_special_tokens: bool | None = Field(
        None, description="prompt: default true (BOS...); messages: false (the template's own)"
    )
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[ToolDef] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Body):
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str
