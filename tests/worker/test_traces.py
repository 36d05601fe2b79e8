"""The worker's spans of each request (in-memory exporter): the client's submit, then
the queue wait, claim, admission, prefill, decode and publishing, in one trace."""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

import fakeredis
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from producer.client import Client
from shared import tracing
from shared.models import FinalEvent, FinishReason, GenerationRequest
from shared.ops.claim import Claimed
from shared.settings import Settings
from tests.conftest import as_tenant, serve
from tests.in_memory_spans import by_name, hex_ids, spans
from tests.worker.fakes import ScriptedEngine, lockstep
from worker.engine.outputs import RequestOutput
from worker.engine.schedule_events import ScheduleEvent, ScheduleEvents, ScheduleKind
from worker.held import Held
from worker.service import WorkerService
from worker.traces import WorkerTraces

__all__ = ["spans"]
MODEL = "m"
PHASES = ["tokenq.claim", "tokenq.admission", "tokenq.prefill", "tokenq.decode", "tokenq.publish"]
MS = 1_000_000


def _setup(fake_redis: fakeredis.FakeRedis) -> tuple[Client, WorkerService, ScriptedEngine]:
    settings = Settings(publish_coalesce_ms=0)
    serve(fake_redis, MODEL)
    engine = ScriptedEngine()
    service = lockstep(WorkerService(engine, fake_redis, settings, MODEL, "w1"))
    return Client(connection=fake_redis, settings=settings), service, engine


def _times(span: ReadableSpan) -> tuple[int, int]:
    assert span.start_time is not None and span.end_time is not None
    return span.start_time, span.end_time


def test_a_request_is_one_trace_from_submit_to_its_final(
    fake_redis: fakeredis.FakeRedis, spans: InMemorySpanExporter
) -> None:
    client, service, _ = _setup(fake_redis)
    handle = as_tenant(client, "t1").submit("a b c", model=MODEL, max_tokens=3)
    service.run(burst=True)
    result = handle.result(timeout=1)
    found = by_name(spans)
    assert set(found) == {"tokenq.submit", "tokenq.queue_wait", "tokenq.process", *PHASES}
    trace_id, submit_id, _ = hex_ids(found["tokenq.submit"])
    process = found["tokenq.process"]
    assert process.kind is SpanKind.CONSUMER
    for name in ("tokenq.queue_wait", "tokenq.process"):
        assert hex_ids(found[name])[::2] == (trace_id, submit_id), name
    process_id = hex_ids(process)[1]
    for name in PHASES:
        assert hex_ids(found[name])[::2] == (trace_id, process_id), name
    start, end = _times(process)
    bounds = [_times(found[name]) for name in PHASES]
    assert start == bounds[0][0] and bounds[-1][1] <= end
    for (_, before_end), (after_start, _) in itertools.pairwise(bounds):
        assert before_end <= after_start
    submit_start, _ = _times(found["tokenq.submit"])
    wait_start, wait_end = _times(found["tokenq.queue_wait"])
    assert submit_start - MS <= wait_start <= wait_end <= end

    attributes = dict(process.attributes or {})
    assert attributes["tokenq.request.id"] == handle.id
    assert (attributes["gen_ai.request.model"], attributes["tokenq.tenant"]) == (MODEL, "t1")
    assert attributes["tokenq.priority"] == 50
    assert attributes["gen_ai.usage.input_tokens"] == result.usage.prompt_tokens
    assert attributes["gen_ai.usage.output_tokens"] == result.usage.completion_tokens == 3
    assert attributes["gen_ai.response.finish_reasons"] == ("length",)
    decode = found["tokenq.decode"]
    assert [e.name for e in decode.events] == ["tokenq.first_token"]
    assert decode.events[0].timestamp == _times(decode)[0]


def test_a_request_refused_at_admission_ends_its_trace_failed(
    fake_redis: fakeredis.FakeRedis, spans: InMemorySpanExporter
) -> None:
    client, service, engine = _setup(fake_redis)
    engine.max_prompt_tokens = 2
    handle = client.submit("a b c d e", model=MODEL)
    service.run(burst=True)
    assert handle.result(timeout=1).error is not None
    found = by_name(spans)
    assert "tokenq.prefill" not in found
    for name in ("tokenq.admission", "tokenq.process"):
        assert found[name].status.status_code is StatusCode.ERROR, name


def test_a_request_handed_back_ends_its_spans_saying_so(
    fake_redis: fakeredis.FakeRedis, spans: InMemorySpanExporter
) -> None:
    client, service, _ = _setup(fake_redis)
    client.submit("a b c", model=MODEL, max_tokens=50)
    service.intake()
    service.step()
    assert service.release_all() == 1
    found = by_name(spans)
    assert dict(found["tokenq.process"].attributes or {})["tokenq.outcome"] == "handed back"
    assert "tokenq.publish" not in found
    assert "tokenq.decode" in found  # ended with its request's part here


def test_with_tracing_off_the_worker_keeps_no_trace(fake_redis: fakeredis.FakeRedis) -> None:
    client, service, _ = _setup(fake_redis)
    assert service.traces is None
    handle = client.submit("a b c", model=MODEL, max_tokens=3)
    service.run(burst=True)
    assert handle.result(timeout=1).usage.completion_tokens == 3


def _output(request_id: str, index: int) -> RequestOutput:
    return RequestOutput(request_id, index, [index], f"t{index}", None, None, 3, index + 1)


def test_a_preemption_is_an_event_of_the_one_decode_span(spans: InMemorySpanExporter) -> None:
    """The engine's schedule events as the built-in engine reports them: prefill chunks,
    the prefill's end, then a preemption and the prefill done again mid-decode."""
    engine = SimpleNamespace(schedule_events=None)
    tracer = tracing.tracer()
    assert tracer is not None
    traces = WorkerTraces(tracer, engine, "w1")
    now_ms = time.time_ns() // MS
    claimed = Claimed("r1", "lease", "", 1, 0, created_ms=now_ms, started_ms=now_ms)
    held = Held("r1", "lease", GenerationRequest(model=MODEL, prompt="a b c"))
    traces.claimed([claimed], time.time_ns())
    traces.admitted(claimed, held, time.time_ns())
    schedule = engine.schedule_events
    assert isinstance(schedule, ScheduleEvents)

    def scheduled(*kinds: ScheduleKind) -> None:
        schedule.events += [ScheduleEvent(k, "r1", time.time_ns(), 0, 3) for k in kinds]

    scheduled(ScheduleKind.CHUNK, ScheduleKind.PREFILLED)
    traces.stepped([])  # asynchronous steps: the first token comes a step later
    traces.stepped([_output("r1", 0)])
    scheduled(ScheduleKind.PREEMPTED, ScheduleKind.CHUNK, ScheduleKind.PREFILLED)
    traces.stepped([_output("r1", 1)])
    traces.left_engine("r1")
    traces.finished("r1", FinalEvent(finish_reason=FinishReason.STOP))
    decodes = [s for s in spans.get_finished_spans() if s.name == "tokenq.decode"]
    assert len(decodes) == 1
    assert [e.name for e in decodes[0].events] == [
        "tokenq.first_token",
        "tokenq.preempted",
        "tokenq.prefill.chunk",
    ]
    prefill = by_name(spans)["tokenq.prefill"]
    assert [e.name for e in prefill.events] == ["tokenq.prefill.chunk"]
    assert not traces.awaiting_first and not traces.traces
