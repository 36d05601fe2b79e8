"""The scheduler keeps the running requests' LoRA adapters within max_loras, and a
request held back for its adapter is not starved by later ones."""

from __future__ import annotations

import itertools

from shared.models import FinishReason, SamplingParams
from worker.engine.kv_cache import KVCacheManager
from worker.engine.outputs import RunnerOutput
from worker.engine.request import EngineRequest, LoraRef, Sequence
from worker.engine.scheduler import Scheduler

_seq_numbers = itertools.count()


def make_seq(rid: str, lora: str | None, priority: int = 50) -> Sequence:
    seq_no = next(_seq_numbers)
    ref = None if lora is None else LoraRef(lora, f"/adapters/{lora}")
    request = EngineRequest(
        rid, [1, 2, 3], SamplingParams(temperature=0.0), priority=priority, lora=ref
    )
    return Sequence.from_request(request, seq_no)


def make_scheduler(max_loras: int) -> Scheduler:
    return Scheduler(KVCacheManager(100, 4, False), 8, 64, max_loras=max_loras)


def step(scheduler: Scheduler) -> list[str]:
    out = scheduler.schedule()
    sampled = out.sampled
    token_index = scheduler.advance(out)
    runner_out = RunnerOutput([7] * len(sampled), [None] * len(sampled))
    scheduler.update_from_output(out, runner_out, token_index)
    return [s.seq.request_id for s in out.scheduled]


def finish(scheduler: Scheduler, rid: str) -> None:
    seq = scheduler.get(rid)
    assert seq is not None
    scheduler.finish(seq, FinishReason.STOP)


def test_a_step_runs_at_most_max_loras_adapters_and_any_base_rows() -> None:
    scheduler = make_scheduler(max_loras=2)
    for rid, lora in [("a", "x"), ("b", "y"), ("c", "z"), ("d", None), ("e", "x")]:
        scheduler.add(make_seq(rid, lora))
    assert step(scheduler) == ["a", "b", "d"]  # e waits behind c, held back for z
    assert [s.request_id for s in scheduler.waiting] == ["c", "e"]
    finish(scheduler, "b")
    assert step(scheduler) == ["a", "d", "c", "e"]


def test_a_request_held_back_for_its_adapter_is_not_starved_by_later_ones() -> None:
    scheduler = make_scheduler(max_loras=1)
    scheduler.add(make_seq("a", "x"))
    step(scheduler)
    scheduler.add(make_seq("b", "y", priority=75))
    scheduler.add(make_seq("c", "x"))
    scheduler.add(make_seq("d", None))
    assert step(scheduler) == ["a", "d"]  # c's adapter runs, but c waits behind b
    finish(scheduler, "a")
    assert step(scheduler) == ["d", "b"]
    assert [s.request_id for s in scheduler.waiting] == ["c"]
