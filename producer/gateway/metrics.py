"""Prometheus metrics, named after vLLM's (``vllm:`` -> ``tokenq:``) where they mean the same.

Each app owns its registry, so several apps (tests) never clash.
"""

from __future__ import annotations

import redis.asyncio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from producer.dashboard.queues import known_models, queue_stats
from shared import metric_names as names
from shared.keys import Keys
from shared.models import FinalEvent
from shared.priority import Priority
from shared.registry import KNOWN_MODELS_LIMIT

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
LATENCY_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
LABELS = ("model", "priority")


def priority_band(priority: int) -> str:
    """The named level at or below ``priority`` (keeps the label's values few)."""
    for level in sorted(Priority, reverse=True):
        if priority >= level:
            return level.name.lower()
    return "lowest"


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "tokenq:gateway_requests",
            "requests accepted by the gateway",
            [*LABELS, "api"],
            registry=r,
        )
        self.rejected = Counter(
            "tokenq:gateway_rejected",
            "requests answered with an error",
            ["status", "type"],
            registry=r,
        )
        self.success = Counter(
            names.REQUEST_SUCCESS,
            "requests that ended, by finish reason",
            [*LABELS, "finished_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            names.PROMPT_TOKENS, "prompt tokens of ended requests", LABELS, registry=r
        )
        self.generation_tokens = Counter(
            names.GENERATION_TOKENS, "tokens generated", LABELS, registry=r
        )
        self.ttft = Histogram(
            names.TIME_TO_FIRST_TOKEN,
            "submit to first token",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            names.QUEUE_TIME, "time spent queued", LABELS, buckets=LATENCY_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            names.E2E_LATENCY, "submit to final event", LABELS, buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_depth = Gauge(
            names.QUEUE_DEPTH, "requests waiting in Redis", ["model", "priority"], registry=r
        )
        self.streams = Gauge(
            "tokenq:gateway_open_streams", "SSE streams open now", ["api"], registry=r
        )
        self.disconnects = Counter(
            "tokenq:gateway_client_disconnects",
            "streams the client dropped before the end",
            ["api"],
            registry=r,
        )

    async def observe_queues(self, connection: redis.asyncio.Redis, keys: Keys) -> None:
        """Queued requests per model and priority, read from Redis at scrape time: the
        figure an autoscaler reads (deploy/k8s/keda-scaledobject.yaml)."""
        models = await known_models(connection, keys, KNOWN_MODELS_LIMIT)
        seconds, micros = await connection.time()
        stats = await queue_stats(
            connection, keys, models, int(seconds) * 1000 + int(micros) // 1000
        )
        self.queue_depth.clear()
        for queue in stats:
            for level in queue.priorities:
                self.queue_depth.labels(queue.model, level.name).set(level.depth)

    def accepted(self, model: str, priority: int, api: str) -> None:
        self.requests.labels(model, priority_band(priority), api).inc()

    def finished(self, model: str, priority: int, final: FinalEvent) -> None:
        """Figures of a request the gateway followed to its final event."""
        labels = (model, priority_band(priority))
        self.success.labels(*labels, final.finish_reason.value).inc()
        self.prompt_tokens.labels(*labels).inc(final.usage.prompt_tokens)
        self.generation_tokens.labels(*labels).inc(final.usage.completion_tokens)
        t = final.timings
        for histogram, value in (
            (self.ttft, t.ttft_s),
            (self.queue_time, t.queued_s),
            (self.e2e, t.total_s),
        ):
            if value is not None:
                histogram.labels(*labels).observe(value)
