"""The OpenTelemetry SDK's in-memory exporter as the tracer ``shared.tracing`` uses,
for tests that trace within one process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared import tracing


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", lambda: provider.get_tracer("tests"))
    yield exporter
    provider.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def hex_ids(span: ReadableSpan) -> tuple[str, str, str]:
    """Its trace id, its span id and its parent's span id ('' for a root), as hex."""
    ctx = span.get_span_context()
    assert ctx is not None
    parent = "" if span.parent is None else f"{span.parent.span_id:016x}"
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", parent
