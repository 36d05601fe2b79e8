"""The Responses routes' answers as pydantic models, for the OpenAPI schema (the routes
build them as dicts, ``objects``; the tests check the two agree)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


class ResponseError(BaseModel):
    code: str = Field(
        description="server_error; invalid_prompt (the request could not run as asked: "
        "the message names the field); or tokenq's deadline_expired"
    )
    message: str


class IncompleteDetails(BaseModel):
    reason: str = Field(description="max_output_tokens, or tokenq's timeout (its deadline)")


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(description="0: tokenq does not report its prefix cache's hits")
    cache_write_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseObject(BaseModel):
    """A response, as OpenAI's ``Response`` (``openai.types.responses``)."""

    id: str = Field(description="resp_ and the tokenq request id")
    object: Literal["response"]
    created_at: float
    status: Status
    background: bool
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: None
    metadata: dict[str, str]
    model: str
    output: list[dict[str, Any]] = Field(description="message, reasoning and function_call items")
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any]
    service_tier: str
    store: bool
    temperature: float
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float
    truncation: Literal["disabled"]
    usage: ResponseUsage | None
    user: str | None
    completed_at: float | None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"]
    deleted: Literal[True]


class InputItemList(BaseModel):
    object: Literal["list"]
    data: list[dict[str, Any]] = Field(
        description="message, function_call, function_call_output and reasoning items"
    )
    first_id: str | None
    last_id: str | None
    has_more: bool
