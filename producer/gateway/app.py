"""The gateway's FastAPI app: Redis connections, the stream hub, routes, error handlers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from producer.api_keys import load_api_keys
from producer.body_guard import BodyGuard, Gate
from producer.dashboard.auth import act_refusal
from producer.dashboard.config import DashboardConfig, load_config
from producer.dashboard.routes import create_dashboard_router
from producer.gateway import batches, files, health, native, openai_embeddings, openai_routes
from producer.gateway.anthropic_routes import router as anthropic_router
from producer.gateway.auth import key_refusal
from producer.gateway.backend import Backend
from producer.gateway.config import GatewayConfig
from producer.gateway.errors import install_error_handlers
from producer.gateway.hub import gateway_hub
from producer.gateway.metrics import GatewayMetrics
from producer.gateway.reaper import reap_forever
from producer.gateway.responses_routes import router as responses_router
from producer.gateway.tokenize_routes import router as tokenize_router
from shared import tracing
from shared.connection import cluster_url, connect_async, wait_for_redis_async
from shared.keys import Keys
from shared.sentinel import AsyncBlockingSentinelPool, is_sentinel_url
from shared.settings import Settings, get_settings
from shared.version import VERSION

log = logging.getLogger("producer.gateway")
ABOUT = "OpenAI-compatible and native HTTP access to a tokenq queue."


def create_app(settings: Settings | None = None, config: GatewayConfig | None = None) -> FastAPI:
    """The gateway for ``settings`` (default: the environment); API keys from ``config``,
    else from ``TOKENQ_API_KEYS``."""
    settings = settings or get_settings()
    tracing.set_service_name("tokenq-gateway")
    config = config or GatewayConfig(
        api_keys=load_api_keys(settings), max_body_bytes=settings.gateway_max_body_bytes
    )
    dashboard_config = load_config(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backend = await _start(settings, config)
        app.state.backend = backend
        # Serve at once (/readyz answers 503 until Redis does); say when Redis is away.
        waiting = asyncio.create_task(wait_for_redis_async(backend.redis, settings.redis_url, log))
        reaper = asyncio.create_task(reap_forever(backend.redis, settings))
        try:
            yield
        finally:
            waiting.cancel()
            reaper.cancel()
            await backend.hub.stop()
            await backend.redis.aclose()

    app = FastAPI(title="tokenq gateway", version=VERSION, lifespan=lifespan, description=ABOUT)
    app.state.api_keys = config.api_keys
    install_error_handlers(app)
    for module in (openai_routes, openai_embeddings, native, batches, files, health):
        app.include_router(module.router)
    app.include_router(responses_router)
    app.include_router(anthropic_router)
    app.include_router(tokenize_router)
    dashboard = create_dashboard_router(settings, lambda: app.state.backend.redis, dashboard_config)
    app.include_router(dashboard, prefix=ADMIN_PREFIX, include_in_schema=False)
    app.add_middleware(
        BodyGuard,
        max_body_bytes=config.max_body_bytes,
        gate=_gate(dashboard_config),
        path_limits=files.body_limits(settings),
    )
    _declare_400_not_422(app)
    return app


ADMIN_PREFIX = "/admin"


def _gate(dashboard: DashboardConfig) -> Gate:
    """Who may send a body: the dashboard's operator under /admin, a key elsewhere."""

    def gate(request: Request) -> Response | None:
        path = request.url.path
        if path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/"):
            return act_refusal(dashboard, request)
        return key_refusal(request)

    return gate


def _declare_400_not_422(app: FastAPI) -> None:
    """FastAPI documents a 422 for every route with parameters; ours answer bad input
    with 400 and the OpenAI error body (already declared), so drop the 422s."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for operations in schema["paths"].values():
                for operation in operations.values():
                    _fix_responses(operation["responses"])
            for name in ("HTTPValidationError", "ValidationError"):
                schema["components"]["schemas"].pop(name, None)
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]


def _fix_responses(responses: dict[str, Any]) -> None:
    responses.pop("422", None)
    # A streamed-only route gets an empty application/json 200 from FastAPI; it has none.
    content = responses.get("200", {}).get("content", {})
    if content.get("application/json") == {"schema": {}} and len(content) > 1:
        del content["application/json"]


async def _start(settings: Settings, config: GatewayConfig) -> Backend:
    connection = _connect(settings, config)
    hub = gateway_hub(connection, idle_s=config.idle_check_s, keys=Keys(settings.namespace))
    hub.start()
    _log_access(config)
    return Backend(settings, config, connection, hub, GatewayMetrics())


def _connect(settings: Settings, config: GatewayConfig) -> redis.asyncio.Redis:
    """Requests wait for a free connection (up to 10 s) rather than fail at the limit;
    on a cluster the limit holds per node."""
    url, limit = settings.redis_url, config.max_redis_connections
    if cluster_url(url, settings.redis_cluster) is not None:
        return connect_async(url, settings.redis_cluster, max_connections=limit)
    if is_sentinel_url(url):
        blocking = AsyncBlockingSentinelPool
        return connect_async(url, connection_pool_class=blocking, max_connections=limit, timeout=10)
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=limit, timeout=10)
    return redis.asyncio.Redis.from_pool(pool)


def _log_access(config: GatewayConfig) -> None:
    if config.api_keys.open:
        log.warning(
            "no API keys configured (TOKENQ_API_KEYS): the gateway is open to anyone "
            "who can reach it, at any priority"
        )
    else:
        tenants = sorted({k.tenant for k in config.api_keys.by_digest.values()})
        log.info("%d API keys for tenants %s", len(config.api_keys.by_digest), ", ".join(tenants))
