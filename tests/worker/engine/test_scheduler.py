"""The scheduler on its own: hand-built runner outputs, no model."""

from __future__ import annotations

import itertools

from shared.models import FinishReason, SamplingParams
from worker.engine.kv_cache import KVCacheManager
from worker.engine.outputs import RunnerOutput, SchedulerOutput
from worker.engine.request import EngineRequest, SeqStatus, Sequence
from worker.engine.scheduler import Scheduler

_seq_numbers = itertools.count()


def make_seq(
    num_prompt_tokens: int = 10,
    priority: int = 50,
    arrival: float = 0.0,
    rid: str | None = None,
    prompt: list[int] | None = None,
    resumed_tokens: list[int] | None = None,
) -> Sequence:
    seq_no = next(_seq_numbers)
    request = EngineRequest(
        rid or f"r{seq_no}", prompt or list(range(100, 100 + num_prompt_tokens)),
        SamplingParams(temperature=0.0), priority=priority, arrival=arrival,
        output_token_ids=list(resumed_tokens or []),
    )  # fmt: skip
    return Sequence.from_request(request, seq_no)


def make_scheduler(
    num_blocks: int = 100,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    prefill_chunk_tokens: int | None = None,
    enable_prefix_caching: bool = False,
    ttft_priority: int | None = None,
    max_num_resumed_seqs: int = 0,
) -> Scheduler:
    kv_cache = KVCacheManager(num_blocks, block_size, enable_prefix_caching)
    return Scheduler(
        kv_cache,
        max_num_seqs,
        max_num_batched_tokens,
        prefill_chunk_tokens,
        ttft_priority=ttft_priority,
        max_num_resumed_seqs=max_num_resumed_seqs,
    )


def run_step(scheduler: Scheduler, token_id: int = 7) -> SchedulerOutput:
    """Schedule a step and feed back one sampled token per sampling sequence."""
    out = scheduler.schedule()
    sampled = out.sampled
    token_index = scheduler.advance(out)
    scheduler.update_from_output(
        out, RunnerOutput([token_id] * len(sampled), [None] * len(sampled)), token_index
    )
    return out


def plan(out: SchedulerOutput) -> list[tuple[str, int, int, bool]]:
    return [(s.seq.request_id, s.start_pos, s.num_tokens, s.sample) for s in out.scheduled]


def test_token_budget_chunks_the_prompt_that_does_not_fit() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=16)
    for rid in "abc":
        scheduler.add(make_seq(10, rid=rid))
    assert plan(run_step(scheduler)) == [("a", 0, 10, True), ("b", 0, 6, False)]
    assert plan(run_step(scheduler)) == [("a", 10, 1, True), ("b", 6, 4, True), ("c", 0, 10, True)]


def test_prefill_chunks_are_mixed_with_decodes() -> None:
    scheduler = make_scheduler(prefill_chunk_tokens=4)
    scheduler.add(make_seq(2, rid="a"))
    run_step(scheduler)
    scheduler.add(make_seq(10, rid="b"))
    assert plan(run_step(scheduler)) == [("a", 2, 1, True), ("b", 0, 4, False)]
    assert plan(run_step(scheduler)) == [("a", 3, 1, True), ("b", 4, 4, False)]
    assert plan(run_step(scheduler)) == [("a", 4, 1, True), ("b", 8, 2, True)]


def test_new_requests_join_the_running_batch_between_steps() -> None:
    scheduler = make_scheduler()
    scheduler.add(make_seq(3, rid="a"))
    run_step(scheduler)
    scheduler.add(make_seq(3, rid="b"))
    assert plan(run_step(scheduler)) == [("a", 3, 1, True), ("b", 0, 3, True)]


def test_batch_size_is_capped_at_max_num_seqs() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    for rid in "abc":
        scheduler.add(make_seq(3, rid=rid))
    assert [s.seq.request_id for s in run_step(scheduler).scheduled] == ["a", "b"]
    assert [s.request_id for s in scheduler.waiting] == ["c"]


def test_a_request_resumed_mid_answer_joins_a_full_batch_in_a_kept_row() -> None:
    s = make_scheduler(max_num_seqs=2, max_num_resumed_seqs=1)
    for seq in (make_seq(4, priority=100), make_seq(4, priority=100)):
        s.add(seq)
    run_step(s)
    fresh, resumed = make_seq(4, priority=100), make_seq(4, priority=25, resumed_tokens=[7, 7])
    late = make_seq(4, priority=25, resumed_tokens=[7])
    for seq in (fresh, resumed, late):
        s.add(seq)
    run_step(s)
    # Only one row is kept: the more urgent new request, and the second resumed one, wait.
    assert [q.status for q in (fresh, resumed, late)] == [
        SeqStatus.WAITING,
        SeqStatus.RUNNING,
        SeqStatus.WAITING,
    ]
    assert len(s.running) == 3


def test_new_work_never_preempts_a_resumed_request_in_a_kept_row() -> None:
    s = make_scheduler(max_num_seqs=1, max_num_resumed_seqs=1)
    running, resumed = make_seq(4, priority=50), make_seq(4, priority=25, resumed_tokens=[7])
    for seq in (running, resumed):
        s.add(seq)
    run_step(s)
    urgent = make_seq(4, priority=100)
    s.add(urgent)
    out = run_step(s)
    assert out.preempted == [running]  # the new-work row, not the resumed one's
    assert [q.status for q in (urgent, resumed)] == [SeqStatus.RUNNING, SeqStatus.RUNNING]


def test_without_kept_rows_a_resumed_request_waits_like_any_other() -> None:
    s = make_scheduler(max_num_seqs=2)
    for seq in (make_seq(4), make_seq(4)):
        s.add(seq)
    run_step(s)
    resumed = make_seq(4, resumed_tokens=[7])
    s.add(resumed)
    run_step(s)
    assert resumed.status is SeqStatus.WAITING


def test_waiting_requests_are_admitted_in_priority_then_arrival_order() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    scheduler.add(make_seq(3, priority=25, arrival=0.0, rid="low"))
    scheduler.add(make_seq(3, priority=75, arrival=2.0, rid="high-late"))
    scheduler.add(make_seq(3, priority=75, arrival=1.0, rid="high-early"))
    assert [s.seq.request_id for s in run_step(scheduler).scheduled] == ["high-early", "high-late"]


def test_kv_pressure_preempts_the_least_urgent_latest_request() -> None:
    # 7 blocks of 4 tokens: three 8-token prompts take 2 blocks each; each next
    # token needs a third block, and only one is left.
    scheduler = make_scheduler(num_blocks=7)
    scheduler.add(make_seq(8, priority=50, arrival=1.0, rid="normal-early"))
    scheduler.add(make_seq(8, priority=50, arrival=2.0, rid="normal-late"))
    scheduler.add(make_seq(8, priority=75, arrival=3.0, rid="high"))
    run_step(scheduler)
    out = run_step(scheduler)
    assert [s.request_id for s in out.preempted] == ["normal-late"]
    assert sorted(s.seq.request_id for s in out.scheduled) == ["high", "normal-early"]


def test_a_preempted_request_resumes_from_all_its_tokens() -> None:
    scheduler = make_scheduler(num_blocks=5)
    scheduler.add(make_seq(8, priority=75, rid="keep"))
    scheduler.add(make_seq(8, priority=25, rid="victim"))
    run_step(scheduler, token_id=1)
    out = run_step(scheduler, token_id=2)
    victim = out.preempted[0]
    assert victim.request_id == "victim"
    assert victim.num_computed_tokens == 0 and victim.status is SeqStatus.WAITING
    assert victim.output_token_ids == [1]
    keep = scheduler.running[0]
    scheduler.finish(keep, FinishReason.STOP)
    # Recomputes prompt and its one output token, then samples its second token.
    assert plan(run_step(scheduler, token_id=3)) == [("victim", 0, 9, True)]
    assert victim.output_token_ids == [1, 3]


def test_prefill_chunk_shrinks_to_the_free_blocks_before_preempting() -> None:
    scheduler = make_scheduler(num_blocks=5, prefill_chunk_tokens=8)
    scheduler.add(make_seq(4, priority=75, rid="a"))
    run_step(scheduler)
    scheduler.add(make_seq(12, priority=50, rid="b"))
    # b is admitted only when all of it fits: 1 + 4 blocks needed, 4 free.
    assert plan(run_step(scheduler)) == [("a", 4, 1, True)]
    assert [s.request_id for s in scheduler.waiting] == ["b"]


def test_a_waiting_urgent_request_preempts_lower_priority_work_when_full() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    scheduler.add(make_seq(3, priority=25, arrival=1.0, rid="low-early"))
    scheduler.add(make_seq(3, priority=25, arrival=2.0, rid="low-late"))
    run_step(scheduler)
    scheduler.add(make_seq(3, priority=100, arrival=3.0, rid="critical"))
    out = run_step(scheduler)
    assert [s.request_id for s in out.preempted] == ["low-late"]
    assert plan(out) == [("low-early", 3, 1, True), ("critical", 0, 3, True)]


def test_equal_priority_waits_instead_of_preempting() -> None:
    scheduler = make_scheduler(max_num_seqs=1)
    scheduler.add(make_seq(3, priority=50, arrival=1.0, rid="running"))
    run_step(scheduler)
    scheduler.add(make_seq(3, priority=50, arrival=0.0, rid="earlier-but-late-to-the-engine"))
    out = run_step(scheduler)
    assert not out.preempted
    assert plan(out) == [("running", 3, 1, True)]


def test_finish_frees_the_blocks() -> None:
    scheduler = make_scheduler(num_blocks=10)
    seq = make_seq(7, rid="a")
    scheduler.add(seq)
    run_step(scheduler)
    assert scheduler.kv_cache.num_free_blocks == 8
    scheduler.finish(seq, FinishReason.CANCELLED)
    assert scheduler.kv_cache.num_free_blocks == 10 and seq.block_table == []
    assert not scheduler.has_unfinished() and seq.finish_reason is FinishReason.CANCELLED


def test_finishing_a_waiting_request_removes_it() -> None:
    scheduler = make_scheduler(max_num_seqs=1)
    scheduler.add(make_seq(3, rid="a"))
    waiting = make_seq(3, rid="b")
    scheduler.add(waiting)
    run_step(scheduler)
    scheduler.finish(waiting, FinishReason.CANCELLED)
    assert [s.request_id for s in scheduler.waiting] == []


def test_aging_lets_a_starved_low_request_overtake() -> None:
    now = [0.0]
    kv_cache = KVCacheManager(100, 4)
    scheduler = Scheduler(kv_cache, 1, 64, aging_interval_s=1.0, clock=lambda: now[0])
    scheduler.add(make_seq(3, priority=25, arrival=0.0, rid="low"))
    scheduler.add(make_seq(3, priority=50, arrival=1.0, rid="normal"))
    assert plan(run_step(scheduler))[0][0] == "normal"
    scheduler.finish(scheduler.running[0], FinishReason.STOP)
    now[0] = 29.0
    scheduler.add(make_seq(3, priority=50, arrival=2.0, rid="normal-2"))
    now[0] = 30.0  # low has waited 30 s (25 + 30 points), normal-2 1 s (50 + 1)
    assert plan(run_step(scheduler))[0][0] == "low"


def test_priority_order_is_priority_then_arrival_then_add_order() -> None:
    a = make_seq(priority=50, arrival=1.0)
    b = make_seq(priority=50, arrival=1.0)
    c = make_seq(priority=75, arrival=5.0)
    d = make_seq(priority=50, arrival=0.5)
    assert sorted([a, b, c, d]) == [c, d, a, b]


def test_a_new_request_starts_after_the_blocks_a_running_one_computed() -> None:
    scheduler = make_scheduler(enable_prefix_caching=True)
    scheduler.add(make_seq(rid="a", prompt=list(range(20))))
    run_step(scheduler)
    scheduler.add(make_seq(rid="b", prompt=[*range(14), 99, 98, 97]))
    out = run_step(scheduler)
    # Tokens 0-11 fill three blocks of 4 that "a" computed; 12-13 are in a block
    # that differs, computed again.
    assert plan(out) == [("a", 20, 1, True), ("b", 12, 5, True)]
    a, b = scheduler.running
    assert b.block_table[:3] == a.block_table[:3]
    assert b.block_table[3] not in a.block_table


def test_a_finished_request_s_blocks_serve_a_later_identical_prompt() -> None:
    scheduler = make_scheduler(enable_prefix_caching=True)
    first = make_seq(rid="a", prompt=list(range(20)))
    scheduler.add(first)
    run_step(scheduler)
    scheduler.finish(first, FinishReason.STOP)
    scheduler.add(make_seq(rid="b", prompt=list(range(20))))
    # The last token is computed again, for its logits, so its block is too.
    assert plan(run_step(scheduler)) == [("b", 16, 4, True)]
    kv_cache = scheduler.kv_cache
    assert (kv_cache.num_queried_tokens, kv_cache.num_hit_tokens) == (40, 16)


def test_no_reuse_of_a_prefix_not_computed_yet() -> None:
    scheduler = make_scheduler(enable_prefix_caching=True)
    scheduler.add(make_seq(rid="a", prompt=list(range(20))))
    scheduler.add(make_seq(rid="b", prompt=list(range(20))))
    assert plan(run_step(scheduler)) == [("a", 0, 20, True), ("b", 0, 20, True)]


def test_a_chunked_prefill_caches_each_chunk_s_full_blocks() -> None:
    scheduler = make_scheduler(enable_prefix_caching=True, prefill_chunk_tokens=8)
    scheduler.add(make_seq(rid="a", prompt=list(range(20))))
    run_step(scheduler)
    scheduler.add(make_seq(rid="b", prompt=[*range(8), 50, 51]))
    assert plan(run_step(scheduler)) == [("a", 8, 8, False), ("b", 8, 2, True)]


def test_a_preempted_request_resumes_from_its_blocks_still_cached() -> None:
    scheduler = make_scheduler(num_blocks=5, enable_prefix_caching=True)
    scheduler.add(make_seq(8, priority=75, rid="keep"))
    scheduler.add(make_seq(8, priority=25, prompt=list(range(8)), rid="victim"))
    run_step(scheduler, token_id=1)
    out = run_step(scheduler, token_id=2)
    [victim] = out.preempted
    assert victim.request_id == "victim" and victim.num_computed_tokens == 0
    scheduler.finish(scheduler.running[0], FinishReason.STOP)
    # Its two prompt blocks were still cached: only its one output token is computed.
    assert plan(run_step(scheduler, token_id=3)) == [("victim", 8, 1, True)]
    assert victim.output_token_ids == [1, 3]


def test_an_urgent_request_gets_its_prefill_in_a_step_of_its_own() -> None:
    scheduler = make_scheduler(ttft_priority=100)
    scheduler.add(make_seq(3, priority=50, rid="normal"))
    run_step(scheduler)
    scheduler.add(make_seq(4, priority=100, rid="critical"))
    scheduler.add(make_seq(4, priority=75, rid="high"))
    assert plan(run_step(scheduler)) == [("critical", 0, 4, True)]
    assert plan(run_step(scheduler)) == [
        ("critical", 4, 1, True),
        ("normal", 3, 1, True),
        ("high", 0, 4, True),
    ]
