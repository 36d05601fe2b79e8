"""API keys (``Authorization: Bearer``, or Anthropic's ``x-api-key``): who is calling
(tenant) and the highest priority they may use.

A key asking for more than its ``max_priority`` is refused with 403 rather than
silently capped, so a caller never believes it got a priority it did not. A request
that names no priority gets ``normal``, lowered to the key's maximum when that is less.

With keys configured, each tenant sees only its own requests and batches: another
tenant's id answers 404, as one that does not exist would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import Response

from producer.api_keys import ApiKeys
from producer.gateway.errors import ApiError, error_response
from producer.submit import Submitter
from shared.priority import MAX_PRIORITY, Priority, parse_priority, priority_name
from shared.ratelimit import Limits

OPEN_TENANT = "default"
_bearer = HTTPBearer(auto_error=False, description="an API key from TOKENQ_API_KEYS")


@dataclass(frozen=True)
class Principal:
    tenant: str
    max_priority: int
    sees_all: bool = False  # an open gateway (no keys) has no tenants to keep apart
    weight: float = 1.0
    limits: Limits = field(default_factory=Limits)
    bucket: str = ""

    @property
    def submitter(self) -> Submitter:
        """Who its requests are submitted as (``producer.submit``): its tenant, weight
        and rate limits."""
        return Submitter(self.tenant, self.weight, self.limits, self.bucket)

    @property
    def scope(self) -> str | None:
        """The tenant whose requests and batches this caller may see; None for all."""
        return None if self.sees_all else self.tenant


def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    keys: ApiKeys = request.app.state.api_keys
    if keys.open:
        return Principal(OPEN_TENANT, MAX_PRIORITY, sees_all=True)
    token = credentials.credentials if credentials is not None else _x_api_key(request)
    if not token:
        raise _unauthorized(MISSING_KEY)
    key = keys.lookup(token)
    if key is None:
        raise _unauthorized("unknown API key")
    return Principal(key.tenant, key.max_priority, False, key.weight, key.limits, key.bucket)


MISSING_KEY = "missing API key: send it as 'Authorization: Bearer <key>' (or 'x-api-key: <key>')"
Caller = Annotated[Principal, Depends(authenticate)]
# Routes anyone may call; every other route needs a key when keys are configured.
PUBLIC_PATHS = frozenset(
    {"/healthz", "/readyz", "/health", "/metrics", "/docs", "/redoc", "/openapi.json"}
)


def key_refusal(request: Request) -> Response | None:
    """The 401 for a request that needs a key and has none that is known, from its
    headers alone (``producer.body_guard`` asks before the body is read)."""
    keys: ApiKeys = request.app.state.api_keys
    if keys.open or request.url.path in PUBLIC_PATHS:
        return None
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else _x_api_key(request)
    if not token:
        error = _unauthorized(MISSING_KEY)
    elif keys.lookup(token) is None:
        error = _unauthorized("unknown API key")
    else:
        return None
    return error_response(request, error)


def _x_api_key(request: Request) -> str:
    """The key as Anthropic's clients send it."""
    return request.headers.get("x-api-key", "").strip()


def priority_for(principal: Principal, asked: int | str | None, param: str = "priority") -> int:
    """The priority a request runs at: the one asked for, checked against the key."""
    if asked is None:
        return min(int(Priority.NORMAL), principal.max_priority)
    try:
        value = parse_priority(asked)
    except ValueError as e:
        raise ApiError(
            400, f"invalid request: {param}: {e}", param=param, code="invalid_value"
        ) from e
    if value > principal.max_priority:
        limit = priority_name(principal.max_priority)
        raise ApiError(
            403,
            f"{param} {priority_name(value)} is above this API key's maximum "
            f"({limit}); ask for {limit} or less",
            type="permission_error",
            param=param,
            code="priority_not_allowed",
        )
    return value


def _unauthorized(message: str) -> ApiError:
    return ApiError(
        401,
        message,
        type="authentication_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )
