import urllib.error
import urllib.request

from producer.embedded import free_port
from shared.models import FinalEvent, FinishReason, Timings, Usage
from worker.metrics import WorkerMetrics, serve_http


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_health_and_readiness_endpoints() -> None:
    metrics, ready = WorkerMetrics("m"), [False]
    port = free_port()
    server = serve_http(port, metrics, lambda: ready[0])
    try:
        final = FinalEvent(
            finish_reason=FinishReason.LENGTH,
            usage=Usage(prompt_tokens=7, completion_tokens=3),
            timings=Timings(queued_s=0.1, ttft_s=0.2, total_s=0.5),
        )
        metrics.on_tokens(3, 0.09)
        metrics.on_finish(75, final)
        base = f"http://127.0.0.1:{port}"
        assert _get(f"{base}/healthz") == (200, "ok\n")
        assert _get(f"{base}/readyz")[0] == 503
        ready[0] = True
        assert _get(f"{base}/readyz")[0] == 200
        status, body = _get(f"{base}/metrics")
        assert status == 200
        assert 'tokenq:request_success_total{finished_reason="length",model="m"} 1.0' in body
        assert 'tokenq:generation_tokens_total{model="m"} 3.0' in body
        assert 'tokenq:prompt_tokens_total{model="m"} 7.0' in body
        assert 'tokenq:time_to_first_token_seconds_count{model="m",priority="high"} 1.0' in body
        assert 'tokenq:inter_token_latency_seconds_count{model="m"} 1.0' in body
    finally:
        server.shutdown()
        server.server_close()


def test_engine_totals_become_counters_that_only_grow() -> None:
    metrics = WorkerMetrics("m")
    metrics.on_engine_stats({"prefix_cache_queries": 100, "prefix_cache_hits": 60})
    metrics.on_engine_stats({"prefix_cache_queries": 180, "prefix_cache_hits": 64})
    body = metrics.render().decode()
    assert 'tokenq:prefix_cache_queries_total{model="m"} 180.0' in body
    assert 'tokenq:prefix_cache_hits_total{model="m"} 64.0' in body


def test_speculative_decoding_figures_are_exported() -> None:
    metrics = WorkerMetrics("m")
    figures = {
        "spec_decode_num_drafts": 4,
        "spec_decode_num_draft_tokens": 16,
        "spec_decode_num_accepted_tokens": 12,
        "spec_decode_acceptance_rate": 0.75,
        "spec_decode_tokens_per_step": 4.0,
    }
    metrics.on_engine_stats(figures)
    metrics.on_engine_stats({**figures, "spec_decode_num_drafts": 5})
    body = metrics.render().decode()
    assert 'tokenq:spec_decode_num_drafts_total{model="m"} 5.0' in body
    assert 'tokenq:spec_decode_num_accepted_tokens_total{model="m"} 12.0' in body
    assert 'tokenq:spec_decode_acceptance_rate{model="m"} 0.75' in body
    assert 'tokenq:spec_decode_tokens_per_step{model="m"} 4.0' in body
