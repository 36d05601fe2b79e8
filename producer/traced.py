"""The submit span, for the clients and the gateway alike (``shared.tracing``).

A traced submit opens a ``tokenq.submit`` span per request, under the request's own
``traceparent`` when it has one (given to ``submit``, or a gateway's header), else
under the current OpenTelemetry context (a new trace when there is none); the request
then carries the submit span's traceparent, so that the worker's spans and the
gateway's stream go under it. With tracing off the request goes as given.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from shared import tracing
from shared.flows import Enqueued
from shared.models import GenerationRequest

if TYPE_CHECKING:
    from opentelemetry.trace import Span

SUBMIT_SPAN = "tokenq.submit"
STREAM_SPAN = "tokenq.stream"


class SubmitSpans:
    """The requests to enqueue (with their submit spans' traceparents) and the spans."""

    def __init__(self, requests: list[GenerationRequest], spans: Sequence[Span] = ()) -> None:
        self.requests = requests
        self.spans = spans

    def enqueued(self, enqueued: Sequence[Enqueued]) -> None:
        """Name each span's request once Redis has answered."""
        for span, e in zip(self.spans, enqueued, strict=False):
            span.set_attribute("tokenq.request.id", e.request_id)
            span.set_attribute("tokenq.duplicate", e.duplicate)


@contextmanager
def submit_spans(requests: Sequence[GenerationRequest]) -> Iterator[SubmitSpans]:
    """The submit spans of ``requests``, ended when the block ends (failed with the
    block's error); no span at all with tracing off."""
    tracer = tracing.tracer()
    if tracer is None:
        yield SubmitSpans(list(requests))
        return
    spans = [
        tracing.start_span(
            tracer, SUBMIT_SPAN, r.traceparent, tracing.request_attributes(r), kind="PRODUCER"
        )
        for r in requests
    ]
    traced = [
        r.model_copy(update={"traceparent": tracing.traceparent_of(s)})
        for r, s in zip(requests, spans, strict=True)
    ]
    try:
        yield SubmitSpans(traced, spans)
    except BaseException as e:
        for span in spans:
            tracing.fail(span, e)
        raise
    finally:
        for span in spans:
            span.end()
