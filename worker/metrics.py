"""The worker's Prometheus metrics and its health endpoints, on their own port."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from shared import metric_names as names
from shared.models import FinalEvent, Usage
from shared.priority import priority_name
from worker.tenant_metrics import TenantCounters

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5)


class WorkerMetrics:
    def __init__(self, model: str) -> None:
        self.model = model
        self.registry = CollectorRegistry()
        r, by_model, by_priority = self.registry, ["model"], ["model", "priority"]
        self.running = Gauge(names.REQUESTS_RUNNING, "Requests in the batch", by_model, registry=r)
        self.waiting = Gauge(
            names.REQUESTS_WAITING, "Claimed, waiting for the batch", by_model, registry=r
        )
        self.kv_usage = Gauge(names.KV_CACHE_USAGE, "KV cache in use, 0..1", by_model, registry=r)
        self.preemptions = Counter(names.PREEMPTIONS, "Preempted sequences", by_model, registry=r)
        self.prefix_queries = Counter(
            names.PREFIX_CACHE_QUERIES, "Prompt tokens looked up", by_model, registry=r
        )
        self.prefix_hits = Counter(
            names.PREFIX_CACHE_HITS, "Prompt tokens found cached", by_model, registry=r
        )
        self.affinity_claims = Counter(
            names.AFFINITY_CLAIMS, "Requests claimed for a warm prefix", by_model, registry=r
        )
        self.num_affinity_claims = 0  # the same, for the registry entry (the dashboard)
        self.prompt_tokens = Counter(names.PROMPT_TOKENS, "Prompt tokens", by_model, registry=r)
        self.generation_tokens = Counter(
            names.GENERATION_TOKENS, "Tokens generated", by_model, registry=r
        )
        self.success = Counter(
            names.REQUEST_SUCCESS, "Finished requests", ["model", "finished_reason"], registry=r
        )
        self.ttft = Histogram(
            names.TIME_TO_FIRST_TOKEN,
            "Submit to first token",
            by_priority,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            names.E2E_LATENCY,
            "Submit to final event",
            by_priority,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            names.QUEUE_TIME, "Time queued", by_priority, buckets=LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            names.INTER_TOKEN_LATENCY,
            "Between tokens of a request",
            by_model,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.spec_drafts = Counter(
            names.SPEC_DECODE_NUM_DRAFTS, "Rows verified with draft tokens", by_model, registry=r
        )
        self.spec_draft_tokens = Counter(
            names.SPEC_DECODE_NUM_DRAFT_TOKENS, "Draft tokens proposed", by_model, registry=r
        )
        self.spec_accepted_tokens = Counter(
            names.SPEC_DECODE_NUM_ACCEPTED_TOKENS, "Draft tokens kept", by_model, registry=r
        )
        self.spec_acceptance = Gauge(
            names.SPEC_DECODE_ACCEPTANCE_RATE,
            "Share of draft tokens kept since start, 0..1",
            by_model,
            registry=r,
        )
        self.spec_tokens_per_step = Gauge(
            names.SPEC_DECODE_TOKENS_PER_STEP,
            "Tokens a verified row yields per step (kept drafts + 1)",
            by_model,
            registry=r,
        )
        self.tenants = TenantCounters(model, r)
        self._seen: dict[str, int] = {}

    # Bound once, at the first token (a child exists, and is exported, from its first
    # use on): ``labels()`` on every token cost the GPU worker's loop a few µs each.
    @cached_property
    def _generated(self) -> Any:
        return self.generation_tokens.labels(self.model)

    @cached_property
    def _itl(self) -> Any:
        return self.itl.labels(self.model)

    def on_tenant_usage(self, tenant: str | None, usage: Usage) -> None:
        self.tenants.on_usage(tenant, usage)

    def on_tenant_prefix_cache(self, tenant: str | None, num_queried: int, num_hit: int) -> None:
        self.tenants.on_prefix_cache(tenant, num_queried, num_hit)

    def on_tokens(self, num_tokens: int, gap_s: float | None) -> None:
        self._generated.inc(num_tokens)
        if gap_s is not None and num_tokens:
            self._itl.observe(gap_s / num_tokens)

    def on_token_gap(self, gap_s: float, num_tokens: int) -> None:
        """A request's ``num_tokens`` written ``gap_s`` after its previous ones."""
        self._itl.observe(gap_s / num_tokens)

    def on_finish(self, priority: int, final: FinalEvent) -> None:
        label = (self.model, priority_name(priority))
        self.success.labels(self.model, final.finish_reason.value).inc()
        self.prompt_tokens.labels(self.model).inc(final.usage.prompt_tokens)
        for histogram, value in (
            (self.ttft, final.timings.ttft_s),
            (self.e2e, final.timings.total_s),
            (self.queue_time, final.timings.queued_s),
        ):
            if value is not None:
                histogram.labels(*label).observe(value)

    def on_claimed(self, num_by_affinity: int) -> None:
        if num_by_affinity:
            self.num_affinity_claims += num_by_affinity
            self.affinity_claims.labels(self.model).inc(num_by_affinity)

    def on_engine_stats(self, stats: dict[str, float]) -> None:
        self.running.labels(self.model).set(stats.get("running", 0))
        self.waiting.labels(self.model).set(stats.get("waiting", 0))
        self.kv_usage.labels(self.model).set(stats.get("kv_cache_usage", 0))
        for counter, name in (
            (self.preemptions, "preemptions"),
            (self.prefix_queries, "prefix_cache_queries"),
            (self.prefix_hits, "prefix_cache_hits"),
        ):
            self._advance(counter, name, int(stats.get(name, 0)))
        if "spec_decode_num_drafts" in stats:  # the engine speculates
            self._on_spec_stats(stats)

    def _on_spec_stats(self, stats: dict[str, float]) -> None:
        for counter, name in (
            (self.spec_drafts, "spec_decode_num_drafts"),
            (self.spec_draft_tokens, "spec_decode_num_draft_tokens"),
            (self.spec_accepted_tokens, "spec_decode_num_accepted_tokens"),
        ):
            self._advance(counter, name, int(stats[name]))
        self.spec_acceptance.labels(self.model).set(stats["spec_decode_acceptance_rate"])
        self.spec_tokens_per_step.labels(self.model).set(stats["spec_decode_tokens_per_step"])

    def _advance(self, counter: Counter, name: str, total: int) -> None:
        """Counters follow the engine's running totals."""
        seen = self._seen.get(name, 0)
        counter.labels(self.model).inc(max(0, total - seen))
        self._seen[name] = max(total, seen)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def serve_http(port: int, metrics: WorkerMetrics, ready: Callable[[], bool]) -> ThreadingHTTPServer:
    """``/metrics``, ``/healthz`` (the process answers) and ``/readyz`` (model loaded,
    Redis reachable, not draining) on ``port``, from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, metrics.render(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._send(200, b"ok\n")
            elif self.path == "/readyz":
                ok = ready()
                self._send(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
            else:
                self._send(404, b"not found\n")

        def _send(self, code: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass  # scrapes every few seconds would drown the worker's log

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, name="tokenq-metrics", daemon=True).start()
    return server
