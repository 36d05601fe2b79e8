"""Typed errors and the route class that answers them, whatever app mounts the router.

The body has the gateway's shape, ``{"error": {"message", "type", "code"}}``, so the
page reads one format both under the gateway and alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import redis
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from shared.errors import InvalidRequest, NotFound

log = logging.getLogger("producer.dashboard")


class DashboardError(Exception):
    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "code": self.code}}
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(body, status_code=self.status, headers=headers)


class Unauthorized(DashboardError):
    status = 401
    type = "authentication_error"


class Forbidden(DashboardError):
    status = 403
    type = "permission_error"


class NotFoundError(DashboardError):
    status = 404
    type = "not_found_error"


class Conflict(DashboardError):
    status = 409
    type = "conflict"


class Unavailable(DashboardError):
    status = 503
    type = "service_unavailable"


def as_dashboard_error(exc: Exception) -> DashboardError | None:
    """The answer for an error the data layer may raise, or None to let it propagate."""
    if isinstance(exc, DashboardError):
        return exc
    if isinstance(exc, NotFound):
        return NotFoundError(str(exc), "request_not_found")
    if isinstance(exc, InvalidRequest):
        return DashboardError(str(exc))
    if isinstance(exc, redis.RedisError):
        log.warning("redis error: %s", exc)
        return Unavailable(
            f"Redis is unavailable ({type(exc).__name__}); retry shortly", "redis_unavailable"
        )
    return None


class DashboardRoute(APIRoute):
    """Turns the errors above into JSON answers inside the route (routers have no
    exception handlers of their own, and the host app's would reshape them)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                error = as_dashboard_error(exc)
                if error is None:
                    raise
                return error.response()

        return answer
