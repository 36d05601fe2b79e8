"""The dashboard served alone (``tokenq dashboard``): the same router under ``/admin``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI
from starlette.responses import RedirectResponse, Response

from producer.body_guard import BodyGuard
from producer.dashboard.auth import act_refusal
from producer.dashboard.config import DashboardConfig, load_config
from producer.dashboard.routes import create_dashboard_router
from shared.connection import connect_async
from shared.settings import Settings, get_settings

PREFIX = "/admin"  # also in producer.dashboard.cli, which must not import this module


def create_dashboard_app(
    settings: Settings | None = None, config: DashboardConfig | None = None
) -> FastAPI:
    """An app serving only the dashboard, with its own Redis connection pool."""
    settings = settings or get_settings()
    config = config or load_config(settings)
    connection = connect_async(settings.redis_url, settings.redis_cluster)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await connection.aclose()

    app = FastAPI(
        title="tokenq dashboard",
        lifespan=lifespan,
        docs_url=f"{PREFIX}/docs",
        openapi_url=f"{PREFIX}/openapi.json",
        redoc_url=None,
    )
    app.include_router(create_dashboard_router(settings, connection, config), prefix=PREFIX)
    # Only actions carry a body: refuse one from a caller who may not act before reading it.
    gate = partial(act_refusal, config)
    app.add_middleware(BodyGuard, max_body_bytes=settings.gateway_max_body_bytes, gate=gate)

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return RedirectResponse(f"{PREFIX}/")

    return app
