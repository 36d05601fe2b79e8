"""When tracing is on, and how it exports (shared/tracing.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.sdk.trace import TracerProvider

from shared import tracing
from shared.settings import get_settings

OTLP_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "TOKENQ_OTLP_ENDPOINT",
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A process that has not decided yet, with no OTLP variable set."""
    for name in OTLP_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tracing, "_own", [])
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_without_an_endpoint_tracing_is_off(env: pytest.MonkeyPatch) -> None:
    assert tracing.tracer() is None


def test_the_standard_endpoint_turns_it_on(env: pytest.MonkeyPatch) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert tracing.tracer() is not None


def test_the_protocol_is_grpc_unless_the_standard_variable_says_http(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert isinstance(tracing._exporter(), GrpcExporter)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert isinstance(tracing._exporter(), HttpExporter)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    with pytest.raises(ValueError, match="grpc or http/protobuf"):
        tracing._exporter()


def test_tokenqs_own_setting_names_the_collector(env: pytest.MonkeyPatch) -> None:
    env.setenv("TOKENQ_OTLP_ENDPOINT", "http://collector:4318/")
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    exporter = tracing._exporter()
    assert isinstance(exporter, HttpExporter)
    assert exporter._endpoint == "http://collector:4318/v1/traces"


def test_a_bad_protocol_leaves_tracing_off_and_says_so(
    env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    assert tracing.tracer() is None
    assert "tracing to http://127.0.0.1:9 is off" in caplog.text


def test_an_applications_own_sdk_is_used_with_no_endpoint(env: pytest.MonkeyPatch) -> None:
    provider = TracerProvider()
    env.setattr(trace, "get_tracer_provider", lambda: provider)
    found = tracing.tracer()
    assert found is not None
    with found.start_as_current_span("x") as span:
        assert span.is_recording()
