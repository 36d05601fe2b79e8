"""OpenAI-compatible answers: completions, chat completions and their streamed chunks,
and the model list."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from producer.openai.schemas import ToolCall


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = Field(description="tokens of the reasoning (reasoning_content)")


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = Field(
        None, exclude_if=lambda details: details is None
    )


class TopLogprob(BaseModel):
    token: str = Field(description="the token's text decoded alone (token_id:<id> when not known)")
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class PromptLogprob(BaseModel):
    """vLLM's prompt_logprobs entry: a prompt token's, or a likelier alternative's."""

    logprob: float
    rank: int = Field(description="1 + the number of tokens more likely")
    decoded_token: str


# vLLM's prompt_logprobs: per prompt token (the first null), token id -> its entry.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


def _absent(value: object) -> bool:
    return value is None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    # A reasoning model's reasoning, under vLLM's two names for it.
    reasoning_content: str | None = Field(None, exclude_if=_absent)
    reasoning: str | None = Field(None, exclude_if=_absent)
    tool_calls: list[ToolCall] | None = Field(None, exclude_if=_absent)


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str = Field(
        description="stop, length, tool_calls, or tokenq's timeout / cancelled"
    )


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage
    prompt_logprobs: PromptLogprobs | None = Field(
        None, exclude_if=_absent, description="vLLM: with prompt_logprobs"
    )


class ToolCallDelta(ToolCall):
    index: int


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: CompletionUsage | None = None


class CompletionLogprobs(BaseModel):
    # An echoed prompt's first token has no logprob (null, as OpenAI's).
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: PromptLogprobs | None = Field(
        None, exclude_if=_absent, description="vLLM: with prompt_logprobs"
    )


class Completion(BaseModel):
    """A completion, and (with ``object`` the same) one chunk of a streamed one."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenq"
    num_workers: int = Field(description="tokenq: live workers serving it")
    parent: str | None = Field(None, description="a LoRA adapter's base model")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
