"""The gateway's spans (in-memory exporter): the caller's traceparent header on the
native, OpenAI and Responses routes, the submit span under it, and the stream span
under the submit span."""

from __future__ import annotations

import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from producer import Client
from shared.keys import Keys
from tests.in_memory_spans import hex_ids, spans
from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL
from tests.producer.gateway.sse_client import messages

__all__ = ["spans"]
TRACE_ID, CALLER_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_ID}-01"


def _one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


def _attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def test_a_native_submit_and_its_stream_go_under_the_callers_traceparent(
    gateway: RunningGateway, spans: InMemorySpanExporter
) -> None:
    body = {"model": MODEL, "prompt": "hi", "sampling": {"max_tokens": 4}, "priority": "high"}
    with gateway.client(headers={"traceparent": TRACEPARENT}) as http:
        request_id = http.post("/v1/requests", json=body).json()["id"]
        with http.stream("GET", f"/v1/requests/{request_id}/events") as r:
            assert [m.event for m in messages(r)][-1] == "final"
    submit, stream = _one(spans, "tokenq.submit"), _one(spans, "tokenq.stream")
    assert hex_ids(submit)[::2] == (TRACE_ID, CALLER_ID)
    assert hex_ids(stream)[::2] == (TRACE_ID, hex_ids(submit)[1])
    for span in (submit, stream):
        assert _attributes(span)["tokenq.request.id"] == request_id
        assert _attributes(span)["tokenq.priority"] == 75
    assert _attributes(stream)["gen_ai.usage.output_tokens"] == 4


def test_a_stream_of_a_request_submitted_elsewhere_joins_its_recorded_trace(
    gateway: RunningGateway, spans: InMemorySpanExporter
) -> None:
    with Client(settings=gateway.settings) as client:
        handle = client.submit("hi", model=MODEL, max_tokens=2, traceparent=TRACEPARENT)
    with (
        gateway.client() as http,
        http.stream("GET", f"/v1/requests/{handle.id}/events") as r,
    ):
        assert [m.event for m in messages(r)][-1] == "final"
    submit, stream = _one(spans, "tokenq.submit"), _one(spans, "tokenq.stream")
    assert hex_ids(stream)[::2] == (TRACE_ID, hex_ids(submit)[1])
    assert _attributes(stream)["gen_ai.request.model"] == MODEL


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/responses", {"input": "hi"}),
    ],
)
def test_the_openai_routes_take_the_header_too(
    gateway: RunningGateway, spans: InMemorySpanExporter, path: str, body: dict[str, object]
) -> None:
    full = {"model": MODEL, "stream": True, **body}
    with gateway.client(headers={"traceparent": TRACEPARENT}) as http:
        with http.stream("POST", path, json=full) as r:
            assert r.status_code == 200
            r.read()
        refused = http.post(path, json=full, headers={"traceparent": "00-00-00-00"})
    submit, stream = _one(spans, "tokenq.submit"), _one(spans, "tokenq.stream")
    assert hex_ids(submit)[::2] == (TRACE_ID, CALLER_ID)
    assert hex_ids(stream)[2] == hex_ids(submit)[1]
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "traceparent"


def test_without_tracing_a_valid_header_is_still_checked_and_taken(
    gateway: RunningGateway,
) -> None:
    body = {"model": MODEL, "prompt": "hi"}
    with gateway.client() as http:
        ok = http.post("/v1/requests", json=body, headers={"traceparent": TRACEPARENT})
        bad = http.post("/v1/requests", json=body, headers={"traceparent": "nonsense"})
    assert ok.status_code == 202
    payload = gateway.redis.hget(Keys().request(ok.json()["id"]), "payload")
    assert orjson.loads(payload or b"{}")["traceparent"] == TRACEPARENT  # for the worker
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "traceparent")
