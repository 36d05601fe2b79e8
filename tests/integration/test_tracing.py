"""One request followed end to end: the gateway, Redis and a worker, each a real
process exporting its spans over OTLP/HTTP to a collector on loopback. Its spans form
one trace under the caller's traceparent, linked and nested as documented in
docs/how-to/tracing.md, with the request's attributes. With no endpoint configured,
no span is made: OpenTelemetry is not even imported."""

from __future__ import annotations

import itertools
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from producer.embedded import EmbeddedRedis
from shared.priority import Priority
from shared.settings import DEFAULT_MODEL
from tests.integration import untraced_run
from tests.integration.conftest import WorkerFactory
from tests.integration.otlp_collector import CollectedSpan, Collector, otlp_collector
from tests.producer.gateway.process import gateway_process

pytestmark = pytest.mark.integration
WORKER_ARGS = ("--kv-cache-mib", "64")
API_KEYS = "sk-a=acme:high"
WORKER_SPANS = {"tokenq.claim", "tokenq.admission", "tokenq.prefill", "tokenq.decode"}
ALL_SPANS = {
    "tokenq.submit",
    "tokenq.stream",
    "tokenq.queue_wait",
    "tokenq.process",
    "tokenq.publish",
    *WORKER_SPANS,
}
# Past the CPU engine's 512 tokens a step: its prefill runs in two chunks at least.
LONG_PROMPT = "Count the words in this sentence, please. " * 90
MS = 1_000_000  # Redis's clock (the queue wait's) is in ms


def _otlp_env(endpoint: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # send spans at once, not every 5 s
    }


@pytest.fixture
def gateway_and_worker(
    redis_server: EmbeddedRedis, start_worker: WorkerFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[httpx.Client, Collector]]:
    traced = bool(request.param)
    with otlp_collector() as (endpoint, collector):
        env = _otlp_env(endpoint) if traced else {}
        worker = start_worker(*WORKER_ARGS, env=env)
        with (
            gateway_process(redis_server.url, api_keys=API_KEYS, **env) as url,
            httpx.Client(
                base_url=url, timeout=120, headers={"Authorization": "Bearer sk-a"}
            ) as http,
        ):
            _wait_for_worker(http, worker.poll)
            yield http, collector


def _wait_for_worker(http: httpx.Client, poll: object) -> None:
    for _ in range(900):
        models = http.get("/v1/models").json()["data"]
        if [m["id"] for m in models] == [DEFAULT_MODEL]:
            return
        assert callable(poll) and poll() is None, "the worker exited"
        time.sleep(0.2)
    pytest.fail("the worker did not register in 180s")


def _chat(http: httpx.Client, headers: dict[str, str]) -> tuple[str, dict[str, int]]:
    """A streamed chat completion: its request id and the usage it reported."""
    body = {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
        "priority": "high",
    }
    usage: dict[str, int] = {}
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, r.read()
        request_id = r.headers["x-tokenq-request-id"]
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = orjson.loads(line[6:]).get("usage") or usage
    return request_id, usage


def _within(inner: CollectedSpan, outer: CollectedSpan, slack_ns: int = 0) -> bool:
    return outer.start_ns - slack_ns <= inner.start_ns <= inner.end_ns <= outer.end_ns + slack_ns


@pytest.mark.slow
@pytest.mark.parametrize("gateway_and_worker", [True], indirect=True)
def test_a_request_is_one_trace_across_gateway_queue_and_worker(
    gateway_and_worker: tuple[httpx.Client, Collector],
) -> None:
    http, collector = gateway_and_worker
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = f"00-{trace_id}-{caller_span}-01"
    request_id, usage = _chat(http, {"traceparent": traceparent})
    spans = collector.wait_for(ALL_SPANS)

    assert {s.trace_id for s in spans.values()} == {trace_id}
    submit, process = spans["tokenq.submit"], spans["tokenq.process"]
    assert submit.parent_id == caller_span
    assert submit.service == spans["tokenq.stream"].service == "tokenq-gateway"
    assert process.service == spans["tokenq.decode"].service == "tokenq-worker"
    for name in ("tokenq.queue_wait", "tokenq.process", "tokenq.stream"):
        assert spans[name].parent_id == submit.span_id, name
    for name in (*WORKER_SPANS, "tokenq.publish"):
        assert spans[name].parent_id == process.span_id, name
        assert _within(spans[name], process), name

    # One after the other, in the order a request goes through them.
    order = ["tokenq.claim", "tokenq.admission", "tokenq.prefill", "tokenq.decode"]
    order.append("tokenq.publish")
    for before, after in itertools.pairwise(order):
        assert spans[before].end_ns <= spans[after].start_ns, (before, after)
    queue_wait = spans["tokenq.queue_wait"]
    assert submit.start_ns - MS <= queue_wait.start_ns <= queue_wait.end_ns <= process.end_ns
    assert submit.end_ns <= spans["tokenq.stream"].start_ns

    for span in (submit, process, spans["tokenq.stream"]):
        assert span.attributes["tokenq.request.id"] == request_id
        assert span.attributes["gen_ai.request.model"] == DEFAULT_MODEL
        assert span.attributes["tokenq.tenant"] == "acme"
        assert span.attributes["tokenq.priority"] == int(Priority.HIGH)
    for span in (process, spans["tokenq.stream"]):
        assert span.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
        assert span.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]

    chunks = [e for e in spans["tokenq.prefill"].events if e[0] == "tokenq.prefill.chunk"]
    assert len(chunks) >= 2  # the long prompt's chunks, each an event
    assert sum(e[2]["tokenq.chunk.num_tokens"] for e in chunks) == usage["prompt_tokens"]
    decode = spans["tokenq.decode"]
    assert [e[0] for e in decode.events][:1] == ["tokenq.first_token"]
    assert decode.events[0][1] == decode.start_ns


@pytest.mark.slow
@pytest.mark.parametrize("gateway_and_worker", [True], indirect=True)
def test_a_malformed_traceparent_is_refused_naming_the_header(
    gateway_and_worker: tuple[httpx.Client, Collector],
) -> None:
    http, _ = gateway_and_worker
    body = {"model": DEFAULT_MODEL, "prompt": "hi"}
    reply = http.post("/v1/requests", json=body, headers={"traceparent": "00-abc-01"})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "traceparent"


def _untraced_run(redis_url: str, **env: str) -> dict[str, list[str]]:
    """What ``untraced_run`` reports, run in a fresh process with ``env``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ.pop("TOKENQ_OTLP_ENDPOINT", None)
    cmd = [sys.executable, "-m", "tests.integration.untraced_run", redis_url]
    done = subprocess.run(cmd, env={**environ, **env}, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report: dict[str, list[str]] = orjson.loads(done.stdout.splitlines()[-1])
    return report


def test_without_an_endpoint_no_span_is_made_and_opentelemetry_is_not_imported(
    redis_server: EmbeddedRedis,
) -> None:
    report = _untraced_run(redis_server.url)
    assert report["modules"] == []
    # The caller's trace context is carried as given, for a traced worker to join.
    assert report["traceparents"] == [untraced_run.TRACEPARENT] * 2


def test_with_an_endpoint_the_records_carry_the_submit_spans(
    redis_server: EmbeddedRedis,
) -> None:
    """The same run with an endpoint (nothing listens there: spans are dropped)."""
    report = _untraced_run(redis_server.url, TOKENQ_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert "opentelemetry.sdk.trace" in report["modules"]
    trace_id = untraced_run.TRACEPARENT.split("-")[1]
    for traceparent in report["traceparents"]:
        assert traceparent != untraced_run.TRACEPARENT  # its submit span's, in the same trace
        assert traceparent.split("-")[1] == trace_id
