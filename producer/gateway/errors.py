"""OpenAI-style error bodies and the handlers that make every failure one.

Every error the gateway answers has the body ``{"error": {message, type, param, code}}``,
so OpenAI clients raise their usual exceptions and nothing answers 500 for bad input.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.errors import InvalidRequest, NotFound, QueueFull, RequestTimeout, TokenqError

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """An error the gateway answers on purpose, with its status and OpenAI-style body."""

    def __init__(
        self, status: int, message: str, *, type: str = "invalid_request_error",
        param: str | None = None, code: str | None = None, headers: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(message=message, type=type, param=param, code=code)
        self.headers = dict(headers or {})


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entry of a route that may answer these error statuses."""
    return {
        s: {"model": ErrorResponse, "description": _DESCRIPTIONS.get(s, "error")} for s in statuses
    }


_DESCRIPTIONS = {
    400: "the request was invalid (the body says which field and why)",
    401: "missing or unknown API key",
    403: "the API key may not use the priority asked for",
    404: "no such model (no live worker serves it) or no such request",
    409: "the request has ended and cannot be changed",
    429: "the model's queue is full; retry after Retry-After seconds",
    503: "Redis is unreachable",
    504: "the request's deadline passed before it ran",
}


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def from_validation_errors(errors: Sequence[Any], strip: tuple[str, ...] = ()) -> ApiError:
    """A 400 naming the first bad field (dotted path, OpenAI names) and saying why for each."""
    lines, params = [], []
    for item in errors:
        loc = [str(p) for p in item["loc"] if str(p) not in strip]
        path = ".".join(loc) or "body"
        message = item["msg"]
        if item["type"] in ("extra_forbidden", "extra_forbidden_field"):
            message = f"unknown field {loc[-1]!r}" if loc else "unknown field"
        lines.append(f"{path}: {message}")
        params.append(path)
    return invalid("invalid request: " + "; ".join(lines), params[0] if params else None)


def _json(
    status: int, detail: ErrorDetail, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = ErrorResponse(error=detail).model_dump(mode="json")
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    err = exc if isinstance(exc, ApiError) else ApiError(500, str(exc), type="server_error")
    return _json(err.status, err.detail, err.headers)


async def _request_validation(_: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError | ValidationError) else []
    err = from_validation_errors(errors, strip=("body",))
    return _json(err.status, err.detail)


async def _tokenq_error(_: Request, exc: Exception) -> JSONResponse:
    return await _api_error(_, map_tokenq_error(exc))


def map_tokenq_error(exc: Exception) -> ApiError:
    """The HTTP answer for an error raised by the client library or Redis."""
    if isinstance(exc, QueueFull):
        retry = str(max(1, round(exc.retry_after_s)))
        return ApiError(429, str(exc), type="queue_full", code="queue_full",
                        headers={"Retry-After": retry})  # fmt: skip
    if isinstance(exc, NotFound):
        return ApiError(404, str(exc), type="not_found_error", code="request_not_found")
    if isinstance(exc, InvalidRequest):
        return invalid(str(exc))
    if isinstance(exc, RequestTimeout):
        return ApiError(504, str(exc), type="timeout", code="timeout")
    if isinstance(exc, redis.RedisError):
        log.warning("redis error: %s", exc)
        return ApiError(503, f"Redis is unavailable ({type(exc).__name__}); retry shortly",
                        type="service_unavailable", code="redis_unavailable")  # fmt: skip
    log.exception("unexpected error", exc_info=exc)
    return ApiError(500, "internal error; the gateway log has the details", type="server_error")


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
    detail = exc.detail if isinstance(exc, StarletteHTTPException) else str(exc)
    headers = getattr(exc, "headers", None)
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    return _json(status, ErrorDetail(message=str(detail), type=kind, code=str(status)), headers)


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    err = map_tokenq_error(exc)
    return _json(err.status, err.detail, err.headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(ValidationError, _request_validation)
    app.add_exception_handler(TokenqError, _tokenq_error)
    app.add_exception_handler(redis.RedisError, _unexpected)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
