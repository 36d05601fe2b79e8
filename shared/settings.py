"""Every setting, read from the environment (``TOKENQ_`` prefix) in this one place."""

from functools import lru_cache

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOKENQ_", extra="ignore", frozen=True)

    redis_url: str = "redis://127.0.0.1:6379/0"
    # A Redis Cluster: a redis+cluster:// URL of any node, or any URL with this set.
    # A primary found through Sentinel: redis+sentinel://HOST:PORT[,...]/SERVICE[/DB].
    redis_cluster: bool = False
    # Writes that decide a request's fate (a submit, a claim, a final, a cancel, a dead
    # letter, a reclaim) return only once this many replicas have them (WAIT), or fail
    # with ReplicationTimeout after redis_replica_timeout_ms; 0: as soon as the primary
    # has them (replication is asynchronous: a failover can lose the last moments).
    redis_min_replicas: int = Field(0, ge=0)
    redis_replica_timeout_ms: int = Field(2_000, ge=1)
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
    # A worker whose loop makes no turn for this long (a step stuck, the loop hung)
    # stops renewing its leases, so other workers take its requests; meanwhile a
    # child process keeps the leases of a loop that holds the GIL (worker/lease_keeper.py).
    # 0: no keeper, and no bound (the heartbeat thread renews while it runs).
    worker_stall_limit_ms: int = Field(120_000, ge=0)
    # A claim prefers queued requests whose prefix this worker holds in its cache
    # (claim.lua, bounded so priority and waiting time still rule); false: queue order.
    prefix_affinity: bool = True
    # How long a request may be passed over for other workers' warm matches before any
    # claim takes it first (it is also taken after 16 passes, whichever comes first):
    # about a request's service time, so that its warm worker has a chance to free a row.
    prefix_affinity_max_wait_ms: int = Field(1_000, ge=0)
    # Tenants whose requests share one prefix cache (KV blocks and warm sets) with each
    # other and with requests that have no tenant: a comma list of tenant names, or *
    # for all (a single-tenant deployment). Every other tenant's cache is its own
    # (shared.cache_scope). Set it alike on gateways, clients and workers.
    cache_shared_tenants: str = ""
    drain_timeout_s: float = Field(30.0, ge=0)
    # A worker holds what its engine steps produce for up to this long and then writes
    # it in one round trip: each request's tokens since its last write as one stream
    # entry. Fewer entries, script calls and reader wakeups per token, for at most this
    # much added latency on any event (first token and final event included); 0 writes
    # every step. 45 ms: a few steps go out per write, and the p99 hold stays under the
    # 50 ms tokenq promises (worker/coalesce.py; bench/scale.py, docs/benchmarks.md).
    publish_coalesce_ms: int = Field(45, ge=0, le=1_000)
    # A worker serves /metrics, /healthz and /readyz on this port (off when unset).
    worker_metrics_port: int | None = Field(None, ge=0, le=65535)
    model_cache_dir: str | None = None
    # Tracing (shared.tracing): spans exported over OTLP to this collector (its base
    # URL); unset, the standard OTEL_EXPORTER_OTLP_ENDPOINT turns tracing on; neither, off.
    otlp_endpoint: str | None = None
    # Batches (RQ) keep their records and RQ's queues here. RQ does not run on a Redis
    # Cluster, so with a cluster as redis_url this must name a plain Redis; unset, batches
    # share redis_url.
    batch_redis_url: str | None = None
    # Batches (RQ): lines of one batch in tokenq's queue or running at once, so a
    # batch leaves room in the queue (max_queued) for interactive traffic.
    batch_max_in_flight: int = Field(256, ge=1)
    max_batch_lines: int = Field(50_000, ge=1)
    # One RQ job drives a batch for about batch_tick_s, then hands over to the next,
    # so one RQ worker can drive many batches and a dead worker loses one short job.
    batch_tick_s: float = Field(5.0, gt=0)
    batch_poll_s: float = Field(0.5, gt=0)
    batch_job_timeout_s: int = Field(120, ge=1)
    # A job whose RQ worker stops heartbeating for (job timeout + this) is retried.
    batch_heartbeat_grace_s: int = Field(30, ge=1)
    rq_maintenance_s: int = Field(30, ge=1)
    batch_ttl_s: int = Field(7 * 24 * 3600, ge=1)
    # Files (/v1/files) are kept on the batches' Redis, in chunks: an upload past
    # files_max_bytes is refused with 413; a file expires files_ttl_s after its upload
    # (OpenAI's default for batch files), or sooner when its upload says so.
    files_max_bytes: int = Field(64 * 1024 * 1024, ge=1, le=512 * 1024 * 1024)
    files_ttl_s: int = Field(30 * 24 * 3600, ge=3600)
    # Webhooks: signed with HMAC-SHA256 under webhook_secret; waits before each retry.
    webhook_secret: SecretStr | None = None
    webhook_timeout_s: float = Field(10.0, gt=0)
    webhook_retry_s: tuple[int, ...] = (5, 30, 120, 600, 1800)
    webhook_ttl_s: int = Field(7 * 24 * 3600, ge=1)
    # Gateway API keys: JSON {"sk-a": {"tenant": "acme", "max_priority": "high"}} or
    # compact "sk-a=acme:high,sk-b=beta"; empty leaves the gateway open (it says so).
    api_keys: SecretStr = SecretStr("")
    # The gateway refuses a request body past this with 413, counting as it arrives.
    gateway_max_body_bytes: int = Field(8 * 1024 * 1024, ge=1)
    # A rate limit's concurrent place lapses after this long even if its request's end
    # was never seen (shared.ratelimit).
    rate_limit_inflight_s: int = Field(3600, ge=1)
    # Usage per tenant per hour is kept this long (`tokenq usage`, the dashboard).
    usage_retention_s: int = Field(35 * 24 * 3600, ge=3600)
    # Admin dashboard: every action needs admin_token; viewing too, unless
    # admin_read_only_view. History for its charts: one snapshot per interval.
    admin_token: SecretStr | None = None
    admin_read_only_view: bool = False
    admin_sample_interval_s: float = Field(5.0, ge=0.2, le=60.0)
    admin_history_s: int = Field(3600, ge=60, le=7 * 24 * 3600)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, read once per process."""
    return Settings()
