"""OpenAI-style error bodies and the handlers that make every failure one.

Every error the gateway answers has the body ``{"error": {message, type, param, code}}``,
so OpenAI clients raise their usual exceptions and nothing answers 500 for bad input.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from redis.exceptions import RedisClusterException
from starlette.exceptions import HTTPException as StarletteHTTPException

from producer.anthropic.errors import anthropic_error, is_anthropic_path

# Re-exported: the gateway's routes raise and document these as the gateway's own.
from producer.openai.errors import ApiError as ApiError
from producer.openai.errors import ErrorDetail as ErrorDetail
from producer.openai.errors import ErrorResponse as ErrorResponse
from producer.openai.errors import from_validation_errors as from_validation_errors
from producer.openai.errors import invalid as invalid
from shared.errors import (
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    QueueFull,
    RateLimited,
    ReplicationTimeout,
    RequestTimeout,
    TokenqError,
    UnknownAdapter,
    UnknownModel,
)
from shared.ratelimit import retry_after_header

log = logging.getLogger(__name__)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entry of a route that may answer these error statuses."""
    return {
        s: {"model": ErrorResponse, "description": _DESCRIPTIONS.get(s, "error")} for s in statuses
    }


_DESCRIPTIONS = {
    400: "the request was invalid (the body says which field and why)",
    401: "missing or unknown API key",
    403: "the API key may not use the priority asked for",
    404: "no such request, or a model no worker has served lately",
    409: "the request has ended and cannot be changed, or its idempotency key was sent "
    "before with another body",
    429: "the model's queue is full or the API key is over a rate limit; retry after "
    "Retry-After seconds (x-ratelimit-* say which limit)",
    503: "Redis is unreachable, or its replicas did not confirm a write in time; retry",
    504: "the request's deadline passed before it ran",
}


def error_response(request: Request, err: ApiError) -> JSONResponse:
    """The error response; also counted in tokenq:gateway_rejected_total."""
    backend = getattr(request.app.state, "backend", None)
    if backend is not None:
        backend.metrics.rejected.labels(str(err.status), err.detail.type).inc()
    body = ErrorResponse(error=err.detail).model_dump(mode="json")
    if is_anthropic_path(request.url.path):
        body = anthropic_error(err.status, err.detail)
    return JSONResponse(body, status_code=err.status, headers=err.headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(request, exc if isinstance(exc, ApiError) else map_tokenq_error(exc))


async def _request_validation(request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError | ValidationError) else []
    return error_response(request, from_validation_errors(errors, strip=("body",)))


async def _tokenq_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(request, map_tokenq_error(exc))


def map_tokenq_error(exc: Exception) -> ApiError:
    """The HTTP answer for an error raised by the client library or Redis."""
    if isinstance(exc, QueueFull):
        retry = str(max(1, round(exc.retry_after_s)))
        return ApiError(
            429, str(exc), type="queue_full", code="queue_full", headers={"Retry-After": retry}
        )
    if isinstance(exc, RateLimited):
        return _rate_limited(exc)
    if isinstance(exc, UnknownModel):
        return ApiError(
            404, str(exc), type="not_found_error", param="model", code="model_not_found"
        )
    if isinstance(exc, UnknownAdapter):
        return ApiError(404, str(exc), type="not_found_error", param="model", code="lora_not_found")
    if isinstance(exc, NotFound):
        return ApiError(404, str(exc), type="not_found_error", code="request_not_found")
    if isinstance(exc, IdempotencyKeyReused):  # Stripe's answer too: a conflict, not a 400
        return ApiError(
            409, str(exc), type="invalid_request_error", param="idempotency_key",
            code="idempotency_key_reused",
        )  # fmt: skip
    if isinstance(exc, InvalidRequest):
        return invalid(str(exc), getattr(exc, "param", None))
    if isinstance(exc, RequestTimeout):
        return ApiError(504, str(exc), type="timeout", code="timeout")
    if isinstance(exc, ReplicationTimeout):  # nothing was accepted: retrying is safe
        return ApiError(
            503, str(exc), type="service_unavailable", code="replication_timeout",
            headers={"Retry-After": "1"},
        )  # fmt: skip
    if isinstance(exc, orjson.JSONEncodeError):
        return _unencodable(exc)
    if isinstance(exc, redis.RedisError | RedisClusterException):
        log.warning("redis error: %s", exc)
        return ApiError(
            503,
            f"Redis is unavailable ({type(exc).__name__}); retry shortly",
            type="service_unavailable",
            code="redis_unavailable",
        )
    log.exception("unexpected error", exc_info=exc)
    return ApiError(500, "internal error; the gateway log has the details", type="server_error")


def _unencodable(exc: orjson.JSONEncodeError) -> ApiError:
    """A request holding what JSON cannot carry to a worker (orjson refuses an integer
    past 64 bits and nesting past 255 levels) is the client's mistake, not a 500."""
    log.info("refused a request JSON cannot encode: %s", exc)
    return invalid(
        f"invalid request: a value cannot be sent to the workers ({exc}): integers must "
        "fit in 64 bits and objects and arrays nest at most 255 levels deep",
        code="unencodable_value",
    )


def _rate_limited(exc: RateLimited) -> ApiError:
    """429 with OpenAI's x-ratelimit-* headers, and Retry-After unless it can never fit
    (then 400-like advice in the message, still 429 as OpenAI answers too-large requests)."""
    headers = dict(exc.headers)
    if exc.retry_after_s is not None:
        headers["Retry-After"] = retry_after_header(exc.retry_after_s)
    return ApiError(
        429, str(exc), type="rate_limit_error", code="rate_limit_exceeded", headers=headers
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
    detail = exc.detail if isinstance(exc, StarletteHTTPException) else str(exc)
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    headers = getattr(exc, "headers", None)
    return error_response(
        request, ApiError(status, str(detail), type=kind, code=str(status), headers=headers)
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(ValidationError, _request_validation)
    app.add_exception_handler(TokenqError, _tokenq_error)
    app.add_exception_handler(redis.RedisError, _tokenq_error)
    app.add_exception_handler(orjson.JSONEncodeError, _tokenq_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _tokenq_error)
