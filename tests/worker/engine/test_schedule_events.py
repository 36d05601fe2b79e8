"""The schedule's trace events on their own: prefill chunks and preemptions."""

from __future__ import annotations

from shared.models import FinishReason
from tests.worker.engine.test_scheduler import make_scheduler, make_seq
from worker.engine.outputs import RunnerOutput
from worker.engine.schedule_events import ScheduleEvents, ScheduleKind
from worker.engine.scheduler import Scheduler


def _step(scheduler: Scheduler, events: ScheduleEvents) -> None:
    out = scheduler.schedule()
    events.scheduled(out)
    token_index = scheduler.advance(out)
    scheduler.update_from_output(out, RunnerOutput(token_ids=[7] * len(out.sampled)), token_index)


def test_each_prefill_chunk_is_an_event_and_decode_steps_add_none() -> None:
    scheduler, events = make_scheduler(prefill_chunk_tokens=8), ScheduleEvents()
    seq = make_seq(num_prompt_tokens=20, rid="a")
    scheduler.add(seq)
    events.added(seq)
    for _ in range(5):  # three chunks (8 + 8 + 4), then two decode steps
        _step(scheduler, events)
    chunks = [(e.kind, e.start_pos, e.num_tokens) for e in events.take()]
    assert chunks == [
        (ScheduleKind.CHUNK, 0, 8),
        (ScheduleKind.CHUNK, 8, 8),
        (ScheduleKind.CHUNK, 16, 4),
        (ScheduleKind.PREFILLED, 0, 0),  # the step that yields its first token
    ]
    assert events.prefilling == {}  # decode steps look at no row
    assert events.take() == []


def test_a_preempted_request_is_an_event_and_its_prefill_again_is_followed() -> None:
    scheduler, events = make_scheduler(num_blocks=6, block_size=4), ScheduleEvents()
    low, high = make_seq(12, priority=10, rid="low"), make_seq(12, priority=90, rid="high")
    scheduler.add(low)
    events.added(low)
    _step(scheduler, events)
    _step(scheduler, events)  # low decodes
    scheduler.add(high)
    events.added(high)
    _step(scheduler, events)  # high takes low's blocks
    kinds = [(e.kind, e.request_id) for e in events.take()]
    assert (ScheduleKind.PREEMPTED, "low") in kinds
    assert (ScheduleKind.CHUNK, "high") in kinds
    assert "low" in events.prefilling  # computed again from its start, chunks and all


def test_a_request_that_ends_while_prefilling_is_forgotten() -> None:
    scheduler, events = make_scheduler(prefill_chunk_tokens=4), ScheduleEvents()
    seq = make_seq(num_prompt_tokens=20, rid="a")
    scheduler.add(seq)
    events.added(seq)
    _step(scheduler, events)
    scheduler.finish(seq, FinishReason.CANCELLED)
    _step(scheduler, events)
    assert events.prefilling == {}
