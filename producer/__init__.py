"""The request side of tokenq: Python clients (sync and asyncio), gateway, dashboard."""

from producer.aio import AsyncClient, AsyncHandle
from producer.client import Client, Handle
from producer.submit import Submitter
from shared.errors import (
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    QueueFull,
    RateLimited,
    RequestTimeout,
)
from shared.priority import Priority

__all__ = [
    "AsyncClient",
    "AsyncHandle",
    "Client",
    "Handle",
    "IdempotencyKeyReused",
    "InvalidRequest",
    "NotFound",
    "Priority",
    "QueueFull",
    "RateLimited",
    "RequestTimeout",
    "Submitter",
]
