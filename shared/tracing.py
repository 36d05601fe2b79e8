"""OpenTelemetry spans when they are wanted, and nothing at all when they are not.

Tracing is on in a process when an OTLP endpoint is configured
(``TOKENQ_OTLP_ENDPOINT``, or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), or when the application that embeds a
client has set up the OpenTelemetry SDK itself (its tracer provider and its current
context are used). Otherwise ``tracer()`` answers None: callers make no span object,
and tokenq imports nothing of OpenTelemetry (redis-py and FastAPI import its API
themselves where it is installed). This is the one module that imports it, lazily;
the SDK and its OTLP exporters are the ``tracing`` extra.

Spans join across processes through a W3C ``traceparent`` carried in the request's
record (``GenerationRequest.traceparent``).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from typing import TYPE_CHECKING, Any

from shared.settings import get_settings

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from shared.models import GenerationRequest

# version-trace_id-parent_id-flags, lowercase hex (W3C Trace Context, level 1). A later
# version may append fields after a '-'; version ff is invalid.
TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
log = logging.getLogger(__name__)
INSTRUMENTATION = "tokenq"
# The protocol the SDK's own configuration picks when OTEL_EXPORTER_OTLP_PROTOCOL is unset.
DEFAULT_PROTOCOL = "grpc"
_lock = threading.Lock()
_service = ["tokenq"]
_own: list[Tracer | None] = []  # [] until decided; [None]: off


def check_traceparent(value: str) -> str:
    """``value`` if it is a valid W3C traceparent, else ValueError saying why."""
    match = TRACEPARENT_RE.match(value)
    if match is None:
        raise ValueError(
            "give a W3C traceparent: 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, "
            f"lowercase, got {value[:80]!r}"
        )
    version, trace_id, parent_id, _, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        raise ValueError(f"traceparent version {version} is not valid here")
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        raise ValueError("traceparent: an all-zero trace id or parent id is invalid")
    return value


def set_service_name(name: str) -> None:
    """The ``service.name`` this process's spans carry (OTEL_SERVICE_NAME wins)."""
    _service[0] = name


def otlp_endpoint() -> str | None:
    """The configured OTLP endpoint: tokenq's setting, else the standard variables."""
    return (
        get_settings().otlp_endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or None
    )


def tracer() -> Tracer | None:
    """The tracer to make spans with, or None when tracing is off in this process."""
    app = _application_tracer()
    if app is not None:
        return app
    if not _own:
        with _lock:
            if not _own:
                _own.append(_configured_tracer())
    return _own[0]


def _configured_tracer() -> Tracer | None:
    """This process's own tracer when an endpoint is configured and the SDK is there
    (said once in the log when it is not)."""
    endpoint = otlp_endpoint()
    if endpoint is None:
        return None
    try:
        return _own_tracer()
    except (ImportError, ValueError) as e:
        log.error("tracing to %s is off: %s (pip install 'tokenq[tracing]')", endpoint, e)
        return None


def _application_tracer() -> Tracer | None:
    """The tracer of an SDK the application set up, if it has (looked up without
    importing anything: an application with the SDK has imported it)."""
    sdk = sys.modules.get("opentelemetry.sdk.trace")
    if sdk is None:
        return None
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if not isinstance(provider, sdk.TracerProvider):
        return None
    return trace.get_tracer(INSTRUMENTATION, tracer_provider=provider)


def _own_tracer() -> Tracer:
    """A tracer exporting over OTLP in batches, flushed when the process exits."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: _service[0]}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(_exporter()))
    return provider.get_tracer(INSTRUMENTATION)


def _exporter() -> Any:
    """OTLP over gRPC or HTTP/protobuf, as OTEL_EXPORTER_OTLP(_TRACES)_PROTOCOL says
    (the SDK's own default: grpc). The standard variables configure it as usual;
    TOKENQ_OTLP_ENDPOINT, when set, is the collector's base URL."""
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or DEFAULT_PROTOCOL
    ).strip()
    base = get_settings().otlp_endpoint
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=None if base is None else base.rstrip("/") + "/v1/traces")
    if protocol != "grpc":
        raise ValueError(f"OTLP protocol {protocol!r}: give grpc or http/protobuf")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcSpanExporter,
    )

    return GrpcSpanExporter(endpoint=base)


def context_of(traceparent: str | None) -> Context | None:
    """A parent context from a traceparent (None: the current context)."""
    if traceparent is None:
        return None
    from opentelemetry import trace

    _, trace_id, span_id, flags = traceparent.split("-")[:4]
    parent = trace.SpanContext(
        int(trace_id, 16), int(span_id, 16), True, trace.TraceFlags(int(flags, 16))
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def traceparent_of(span: Span) -> str:
    """The W3C traceparent naming ``span`` as the parent."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def start_span(
    tracer: Tracer,
    name: str,
    parent: str | Span | None,
    attributes: dict[str, Any],
    start_ns: int | None = None,
    kind: str = "INTERNAL",
) -> Span:
    """A span under ``parent`` (a traceparent, a span, or None: the current context)."""
    from opentelemetry import trace

    if parent is None or isinstance(parent, str):
        context = context_of(parent)
    else:
        context = trace.set_span_in_context(parent)
    return tracer.start_span(
        name, context, trace.SpanKind[kind], attributes=attributes, start_time=start_ns
    )


def fail(span: Span, error: BaseException | str) -> None:
    """Mark ``span`` as failed, with the exception (or the message) recorded."""
    from opentelemetry.trace import Status, StatusCode

    if isinstance(error, BaseException):
        span.record_exception(error)
        error = repr(error)
    span.set_status(Status(StatusCode.ERROR, error))


def request_attributes(request: GenerationRequest) -> dict[str, Any]:
    """What every span of a request carries (its id is added where it is known).
    OpenTelemetry's GenAI names where one fits, ``tokenq.*`` where none does."""
    attributes: dict[str, Any] = {
        "gen_ai.request.model": request.model,
        "gen_ai.request.max_tokens": request.sampling.max_tokens,
        "tokenq.priority": request.priority,
    }
    if request.tenant is not None:
        attributes["tokenq.tenant"] = request.tenant
    return attributes
