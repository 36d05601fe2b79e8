"""The gateway's own settings (its API keys are ``producer.api_keys``'s)."""

from __future__ import annotations

from dataclasses import dataclass, field

from producer.api_keys import ApiKeys

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # TOKENQ_GATEWAY_MAX_BODY_BYTES


@dataclass(frozen=True)
class GatewayConfig:
    api_keys: ApiKeys = field(default_factory=ApiKeys)
    # Live models are read from the worker registry at most this often.
    models_cache_s: float = 1.0
    # After this long without events a stream sends an SSE comment (so proxies keep it
    # open) and checks that its request still exists.
    idle_check_s: float = 2.0
    max_redis_connections: int = 200
    # A request body past this is refused with 413 as it arrives (producer.body_guard).
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
