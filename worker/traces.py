"""The worker's spans of each request it runs, made only while tracing is on
(``shared.tracing``; ``worker_traces`` answers None otherwise, and the loop skips
every hook).

Under the request's recorded ``traceparent`` (its submit span):

- ``tokenq.queue_wait``: from its enqueue to its claim, both on Redis's clock (the
  times ``start.lua`` returns), made once the worker has it;
- ``tokenq.process`` (a consumer span), from the claim call to its final's
  acknowledgement, over
  ``tokenq.claim`` (the claim's round trips), ``tokenq.admission`` (payload, chat
  template, tokenizer, the engine's checks), ``tokenq.prefill`` (to its first token;
  each prefill chunk an event), ``tokenq.decode`` (its first token and each
  preemption an event) and ``tokenq.publish`` (from the engine's last output to Redis
  acknowledging the final: the write's hold and its round trip).

The work is per request and per step, never per token: the engine reports prefill
chunks, prefills' ends and preemptions per step (``worker.engine.schedule_events``),
and a step's outputs are looked at only in the steps after a prefill ended.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared import tracing
from shared.models import FinalEvent
from shared.ops.claim import Claimed
from worker.engine.outputs import RequestOutput
from worker.engine.schedule_events import ScheduleEvent, ScheduleEvents, ScheduleKind
from worker.held import Held

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

NS_PER_MS = 1_000_000


@dataclass
class RequestTrace:
    request_id: str
    root: Span
    phase: Span  # prefill, then decode
    decoding: bool = False
    publish: Span | None = None


def worker_traces(engine: Any, worker_id: str) -> WorkerTraces | None:
    """The worker's traces, or None with tracing off."""
    tracer = tracing.tracer()
    return None if tracer is None else WorkerTraces(tracer, engine, worker_id)


class WorkerTraces:
    def __init__(self, tracer: Tracer, engine: Any, worker_id: str) -> None:
        self.tracer = tracer
        self.worker_id = worker_id
        # The built-in engine reports its prefill chunks and preemptions; others do not.
        self.schedule: ScheduleEvents | None = None
        if hasattr(engine, "schedule_events"):
            self.schedule = engine.schedule_events = ScheduleEvents()
        self.claims: dict[str, tuple[int, int]] = {}  # claim call's start and end, ns
        self.traces: dict[str, RequestTrace] = {}
        # Requests whose first token a step's outputs may hold: those whose prefill the
        # engine has just finished (all admitted ones, with an engine that does not say).
        self.awaiting_first: set[str] = set()

    def claimed(self, claimed: list[Claimed], started_ns: int) -> None:
        """A claim call returned (on the claimer's thread, or the loop's)."""
        ended_ns = time.time_ns()
        for c in claimed:
            self.claims[c.request_id] = (started_ns, ended_ns)

    def admitted(
        self, claimed: Claimed, held: Held, started_ns: int, error: str | None = None
    ) -> None:
        """The engine took ``held`` (or refused it with ``error``, ending it)."""
        now_ns = time.time_ns()
        root, admission = self._claimed_and_admitted(claimed, held, started_ns)
        if error is not None:
            for span in (admission, root):
                tracing.fail(span, error)
                span.end(now_ns)
            return
        admission.end(now_ns)
        prefill = self._span("tokenq.prefill", root, _ids(held.request_id), now_ns)
        self.traces[held.request_id] = RequestTrace(held.request_id, root, prefill)
        if self.schedule is None:  # no word of its prefill's end: look from now on
            self.awaiting_first.add(held.request_id)

    def _claimed_and_admitted(
        self, claimed: Claimed, held: Held, started_ns: int
    ) -> tuple[Span, Span]:
        """Its queue wait, its root span with its claim, and its admission (open)."""
        claim_ns = self.claims.pop(claimed.request_id, (started_ns, started_ns))
        attributes = self._attributes(claimed, held)
        self._queue_wait(claimed, held, attributes)
        root = self._span("tokenq.process", held.request.traceparent, attributes, claim_ns[0])
        root.set_attribute("gen_ai.usage.input_tokens", held.num_prompt_tokens)
        ids = _ids(held.request_id)
        self._span("tokenq.claim", root, ids, claim_ns[0]).end(claim_ns[1])
        return root, self._span("tokenq.admission", root, ids, started_ns)

    def stepped(self, outputs: list[RequestOutput]) -> None:
        """After each engine step: the schedule's events, and first tokens."""
        if self.schedule is not None:
            for event in self.schedule.take():
                self._schedule_event(event)
        if self.awaiting_first:
            now_ns = time.time_ns()
            for out in outputs:
                if out.new_token_ids and out.request_id in self.awaiting_first:
                    self._first_token(out.request_id, now_ns)

    def left_engine(self, request_id: str) -> None:
        """The engine gave its last output for ``request_id``: publishing it begins."""
        trace = self.traces.get(request_id)
        if trace is None or trace.publish is not None:
            return
        now_ns = time.time_ns()
        self.awaiting_first.discard(request_id)
        trace.phase.end(now_ns)
        trace.publish = self._span("tokenq.publish", trace.root, _ids(trace.request_id), now_ns)

    def finished(self, request_id: str, final: FinalEvent) -> None:
        """Redis acknowledged its final: its spans end."""
        trace = self.traces.pop(request_id, None)
        if trace is None:
            return
        root = trace.root
        root.set_attribute("gen_ai.usage.input_tokens", final.usage.prompt_tokens)
        root.set_attribute("gen_ai.usage.output_tokens", final.usage.completion_tokens)
        root.set_attribute("gen_ai.response.finish_reasons", [final.finish_reason.value])
        if final.error is not None:
            tracing.fail(root, final.error)
        self._end(request_id, trace)

    def ended(self, request_id: str, outcome: str) -> None:
        """It left this worker without a final of its own (lease lost, handed back)."""
        trace = self.traces.pop(request_id, None)
        if trace is not None:
            trace.root.set_attribute("tokenq.outcome", outcome)
            self._end(request_id, trace)

    def ended_all(self, outcome: str) -> None:
        for request_id in list(self.traces):
            self.ended(request_id, outcome)
        self.claims.clear()

    def _end(self, request_id: str, trace: RequestTrace) -> None:
        now_ns = time.time_ns()
        self.awaiting_first.discard(request_id)
        for span in (trace.phase, trace.publish, trace.root):
            if span is not None and span.is_recording():
                span.end(now_ns)

    def _first_token(self, request_id: str, now_ns: int) -> None:
        self.awaiting_first.discard(request_id)
        trace = self.traces.get(request_id)
        if trace is None or trace.decoding:  # a preempted one's prefill again
            return
        trace.decoding = True
        trace.phase.end(now_ns)
        trace.phase = self._span("tokenq.decode", trace.root, _ids(trace.request_id), now_ns)
        trace.phase.add_event("tokenq.first_token", timestamp=now_ns)

    def _schedule_event(self, event: ScheduleEvent) -> None:
        trace = self.traces.get(event.request_id)
        if trace is None:
            return
        if event.kind is ScheduleKind.PREFILLED:
            self.awaiting_first.add(event.request_id)  # in this step's outputs or the next's
        elif event.kind is ScheduleKind.CHUNK:
            attributes = {
                "tokenq.chunk.start": event.start_pos,
                "tokenq.chunk.num_tokens": event.num_tokens,
            }
            trace.phase.add_event("tokenq.prefill.chunk", attributes, event.time_ns)
        else:
            attributes = {"tokenq.num_generated_tokens": event.num_tokens}
            trace.phase.add_event("tokenq.preempted", attributes, event.time_ns)

    def _queue_wait(self, claimed: Claimed, held: Held, attributes: dict[str, Any]) -> None:
        """Its wait in the queue, on Redis's clock, under its submit span."""
        if claimed.created_ms is None or claimed.started_ms is None:
            return
        start_ns, end_ns = claimed.created_ms * NS_PER_MS, claimed.started_ms * NS_PER_MS
        span = self._span("tokenq.queue_wait", held.request.traceparent, attributes, start_ns)
        span.end(end_ns)

    def _attributes(self, claimed: Claimed, held: Held) -> dict[str, Any]:
        return {
            **tracing.request_attributes(held.request),
            "tokenq.request.id": held.request_id,
            "tokenq.attempt": claimed.attempts,
            "tokenq.worker.id": self.worker_id,
        }

    def _span(
        self, name: str, parent: str | Span | None, attributes: dict[str, Any], start_ns: int
    ) -> Span:
        kind = "CONSUMER" if name == "tokenq.process" else "INTERNAL"
        return tracing.start_span(self.tracer, name, parent, attributes, start_ns, kind)


def _ids(request_id: str) -> dict[str, Any]:
    return {"tokenq.request.id": request_id}
