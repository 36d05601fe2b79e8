"""Liveness, readiness (Redis answers) and Prometheus metrics."""

from __future__ import annotations

from typing import Literal

import redis
from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from producer.gateway.backend import BackendDep
from producer.gateway.errors import ApiError, error_responses

router = APIRouter(tags=["health"])
READY_TIMEOUT_S = 2.0


class Health(BaseModel):
    status: Literal["ok", "ready"]


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up (it does not look at Redis)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses=error_responses(503))
@router.get("/health", response_model=Health, responses=error_responses(503))
async def readyz(backend: BackendDep) -> Health:
    """Redis answers a PING. Also at ``/health``, where vLLM's load balancer checks
    and probes look for a server that can take requests."""
    try:
        await backend.redis.ping()
    except redis.RedisError as e:
        raise ApiError(
            503, f"Redis is unreachable: {e}", type="service_unavailable", code="redis_unavailable"
        ) from e
    return Health(status="ready")


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
            "description": "Prometheus text format",
        }
    },
)
async def metrics(backend: BackendDep) -> Response:
    await backend.metrics.observe_queues(backend.redis, backend.keys)
    body = generate_latest(backend.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
