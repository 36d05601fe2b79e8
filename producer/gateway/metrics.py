"""Prometheus metrics, named after vLLM's (``vllm:`` -> ``tokenq:``) where they mean the same.

Each app owns its registry, so several apps (tests) never clash.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.models import FinalEvent
from shared.priority import Priority

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
        self.requests = Counter("tokenq:gateway_requests", "requests accepted by the gateway",
                                [*LABELS, "api"], registry=r)  # fmt: skip
        self.rejected = Counter("tokenq:gateway_rejected", "requests answered with an error",
                                ["status", "type"], registry=r)  # fmt: skip
        self.success = Counter("tokenq:request_success", "requests that ended, by finish reason",
                               [*LABELS, "finished_reason"], registry=r)  # fmt: skip
        self.prompt_tokens = Counter("tokenq:prompt_tokens", "prompt tokens of ended requests",
                                     LABELS, registry=r)  # fmt: skip
        self.generation_tokens = Counter("tokenq:generation_tokens", "tokens generated",
                                         LABELS, registry=r)  # fmt: skip
        self.ttft = Histogram("tokenq:time_to_first_token_seconds", "submit to first token",
                              LABELS, buckets=TTFT_BUCKETS, registry=r)  # fmt: skip
        self.queue_time = Histogram("tokenq:request_queue_time_seconds", "time spent queued",
                                    LABELS, buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.e2e = Histogram("tokenq:e2e_request_latency_seconds", "submit to final event",
                             LABELS, buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.streams = Gauge("tokenq:gateway_open_streams", "SSE streams open now", ["api"],
                             registry=r)  # fmt: skip
        self.disconnects = Counter("tokenq:gateway_client_disconnects",
                                   "streams the client dropped before the end", ["api"],
                                   registry=r)  # fmt: skip

    def accepted(self, model: str, priority: int, api: str) -> None:
        self.requests.labels(model, priority_band(priority), api).inc()

    def finished(self, model: str, priority: int, final: FinalEvent) -> None:
        """Figures of a request the gateway followed to its final event."""
        labels = (model, priority_band(priority))
        self.success.labels(*labels, final.finish_reason.value).inc()
        self.prompt_tokens.labels(*labels).inc(final.usage.prompt_tokens)
        self.generation_tokens.labels(*labels).inc(final.usage.completion_tokens)
        t = final.timings
        for histogram, value in ((self.ttft, t.ttft_s), (self.queue_time, t.queued_s),
                                 (self.e2e, t.total_s)):  # fmt: skip
            if value is not None:
                histogram.labels(*labels).observe(value)
