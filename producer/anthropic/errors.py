"""Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``, its
type named after the HTTP status as Anthropic's API names them (the SDK raises its
exception by the status; clients read the type)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from producer.openai.errors import ErrorDetail

# The path prefix of the Anthropic routes: their errors take this shape.
ANTHROPIC_PATH = "/v1/messages"
TYPE_OF_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def error_type(status: int) -> str:
    """Anthropic's error type for ``status`` (other 4xx are the request's fault, other
    5xx the API's)."""
    default = "invalid_request_error" if status < 500 else "api_error"
    return TYPE_OF_STATUS.get(status, default)


def anthropic_error(status: int, detail: ErrorDetail) -> dict[str, Any]:
    """The body for an error the gateway raised (``detail`` in OpenAI's shape); the
    field at fault is named in the message, as Anthropic's messages name it."""
    message = detail.message
    if detail.param and detail.param not in message:
        message = f"{detail.param}: {message}"
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """The body of every error the Anthropic routes answer."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


def anthropic_error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entry of an Anthropic route that may answer these statuses."""
    return {s: {"model": AnthropicErrorResponse, "description": error_type(s)} for s in statuses}
