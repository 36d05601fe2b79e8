"""OpenAI-style errors: the ``{"error": {message, type, param, code}}`` body, and the
exception that carries it with its HTTP status (the gateway answers it; a batch line
keeps it as the line's error)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """An error answered on purpose, with its status and OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(message=message, type=type, param=param, code=code)
        self.headers = dict(headers or {})


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def from_validation_errors(errors: Sequence[Any], strip: tuple[str, ...] = ()) -> ApiError:
    """A 400 naming the first bad field (dotted path, OpenAI names) and saying why for each."""
    lines, params = [], []
    for item in errors:
        loc = [str(p) for p in item["loc"] if str(p) not in strip]
        message = item["msg"]
        if item["type"] == "extra_forbidden" and loc:
            message = f"unknown field {loc[-1]!r}"
        lines.append(f"{'.'.join(loc) or 'request'}: {message}")
        params.append(".".join(loc) or None)
    return invalid("invalid request: " + "; ".join(lines), params[0] if params else None)
