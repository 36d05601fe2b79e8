"""Every setting, read from the environment (``TOKENQ_`` prefix) in this one place."""

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOKENQ_", extra="ignore", frozen=True)

    redis_url: str = "redis://127.0.0.1:6379/0"
    namespace: str = Field("tokenq", pattern=r"^[A-Za-z0-9_\-]{1,64}$")
    default_model: str = DEFAULT_MODEL
    # Backpressure: queued requests allowed per model before submit raises QueueFull.
    max_queued: int = Field(10_000, ge=1)
    max_prompt_chars: int = Field(200_000, ge=1)
    # Refuse a model that no worker has served for served_ttl_s (UnknownModel),
    # rather than let its requests wait for a worker that may never come.
    require_known_model: bool = True
    served_ttl_s: int = Field(24 * 3600, ge=1)
    # How long a finished request, its stream and its idempotency key are kept.
    result_ttl_s: int = Field(24 * 3600, ge=1)
    idempotency_ttl_s: int = Field(24 * 3600, ge=1)
    # Leases: a worker renews every lease_ms / 3; a lease not renewed for lease_ms expires.
    lease_ms: int = Field(10_000, ge=100)
    max_attempts: int = Field(3, ge=1)
    worker_heartbeat_ms: int = Field(2_000, ge=50)
    drain_timeout_s: float = Field(30.0, ge=0)
    # A worker serves /metrics, /healthz and /readyz on this port (off when unset).
    worker_metrics_port: int | None = Field(None, ge=0, le=65535)
    model_cache_dir: str | None = None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, read once per process."""
    return Settings()
