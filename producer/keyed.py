"""A client that carries an API key: its tenant, weight and rate limits.

``Client(api_key=...)`` looks the key up in ``TOKENQ_API_KEYS``, as a gateway does,
so its requests are its tenant's (kept apart, weighted in the fair order) and count
against the same rate limits in Redis as the key's requests through any gateway.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from producer.gateway.config import ApiKey, load_api_keys
from shared.errors import InvalidRequest
from shared.flows import Enqueued, Flow, enqueue_flow
from shared.keys import Keys
from shared.models import TENANT, TENANT_WEIGHT, GenerationRequest
from shared.ratelimit import limited_enqueue_flow, rate_limited
from shared.settings import Settings


def find_key(settings: Settings, api_key: str) -> ApiKey:
    key = load_api_keys(settings).lookup(api_key)
    if key is None:
        raise InvalidRequest(
            "unknown API key: give one listed in TOKENQ_API_KEYS (the gateway's keys)"
        )
    return key


def as_tenant(request: GenerationRequest, key: ApiKey) -> GenerationRequest:
    """The request as the key's tenant submits it (its metadata's claims replaced)."""
    metadata = {k: v for k, v in request.metadata.items() if k != TENANT_WEIGHT}
    metadata[TENANT] = key.tenant
    if key.weight != 1.0:
        metadata[TENANT_WEIGHT] = key.weight
    return request.model_copy(update={"metadata": metadata})


def submit_flow(
    keys: Keys, settings: Settings, key: ApiKey | None, reqs: Sequence[GenerationRequest]
) -> Flow[list[Enqueued]]:
    """Enqueue, under the key's limits when it has any; RateLimited for the first
    request over a limit (those before it stay accepted, as with QueueFull)."""
    if key is None or not key.limits.any:
        return (yield from enqueue_flow(keys, settings, list(reqs)))
    now_ms = int(time.time() * 1000)
    flow = limited_enqueue_flow(keys, settings, key.bucket, key.limits, reqs, now_ms)
    enqueued, last = yield from flow
    if last is not None and not last.ok:
        raise rate_limited(last)
    return enqueued
