"""Who may look and who may act: the admin token, and read-only viewing.

The token travels as ``Authorization: Bearer <token>`` on every call, the live
streams included (the page reads them with fetch, not EventSource), so no cookie
is set and no cross-site form can act on an operator's behalf.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from producer.dashboard.config import DashboardConfig
from producer.dashboard.errors import DashboardError, Forbidden, Unauthorized, Unavailable

TOKEN_HINT = "enter the admin token on the page, or send 'Authorization: Bearer <token>'"


@dataclass(frozen=True)
class Access:
    can_view: bool
    can_act: bool
    read_only_view: bool
    token_configured: bool


def access_for(config: DashboardConfig, request: Request) -> Access:
    """What this caller may do; raises for a wrong token and for an unusable setup."""
    token = bearer_token(request)
    configured = config.token_sha256 is not None
    if token is not None:
        if not config.token_matches(token):
            raise Forbidden("wrong admin token: check TOKENQ_ADMIN_TOKEN", "wrong_admin_token")
        return Access(True, True, config.read_only_view, configured)
    if not configured and not config.read_only_view:
        raise Unavailable(
            "the dashboard is off: set TOKENQ_ADMIN_TOKEN (and optionally "
            "TOKENQ_ADMIN_READ_ONLY_VIEW=true)",
            "dashboard_off",
        )
    return Access(config.read_only_view, False, config.read_only_view, configured)


def require_view(config: DashboardConfig, request: Request) -> Access:
    access = access_for(config, request)
    if not access.can_view:
        raise Unauthorized(f"admin token required to view: {TOKEN_HINT}", "admin_token_required")
    return access


def require_act(config: DashboardConfig, request: Request) -> Access:
    access = access_for(config, request)
    if not access.can_act:
        reason = "read-only view: actions" if access.can_view else "actions"
        raise Unauthorized(f"{reason} need the admin token: {TOKEN_HINT}", "admin_token_required")
    return access


def act_refusal(config: DashboardConfig, request: Request) -> Response | None:
    """The refusal for a request that carries a body (only actions do) from a caller
    who may not act, from its headers alone (``producer.body_guard``)."""
    try:
        require_act(config, request)
    except DashboardError as e:
        return e.response()
    return None


def bearer_token(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
