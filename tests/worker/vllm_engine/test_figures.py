"""vLLM's figures as its steps report them, what the worker shows of them, and how many
requests it claims from them (plain Python: no vLLM here)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import fakeredis

from shared.settings import Settings
from tests.worker.fakes import ScriptedEngine
from worker.metrics import WorkerMetrics
from worker.service import WorkerService
from worker.vllm_engine.figures import KV_FULL, NUM_LOOKAHEAD, Figures

MAX_NUM_SEQS = 8


def scheduler_stats(
    running: int = 0,
    waiting: int = 0,
    kv_cache_usage: float = 0.0,
    spec: tuple[int, int, int] | None = None,
) -> SimpleNamespace:
    """vLLM's ``SchedulerStats`` as a step hands it over; ``spec``: drafts, draft tokens,
    accepted tokens."""
    drafts = None
    if spec is not None:
        num_drafts, num_draft_tokens, num_accepted = spec
        drafts = SimpleNamespace(
            num_drafts=num_drafts,
            num_draft_tokens=num_draft_tokens,
            num_accepted_tokens=num_accepted,
        )
    return SimpleNamespace(
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        kv_cache_usage=kv_cache_usage,
        prefix_cache_stats=SimpleNamespace(queries=0, hits=0),
        spec_decoding_stats=drafts,
    )


def preempted(num: int) -> SimpleNamespace:
    return SimpleNamespace(num_preempted_reqs=num)


def test_preemptions_and_speculative_acceptance_add_up_over_steps() -> None:
    figures = Figures()
    figures.record(scheduler_stats(running=8, spec=(4, 12, 6)), preempted(1))
    figures.record(scheduler_stats(running=7, spec=(4, 12, 9)), preempted(2))
    figures.record(None, preempted(0))
    stats = figures.stats()
    assert (stats["running"], stats["preemptions"]) == (7, 3)
    assert stats["spec_decode_num_drafts"] == 8
    assert stats["spec_decode_num_draft_tokens"] == 24
    assert stats["spec_decode_num_accepted_tokens"] == 15
    assert stats["spec_decode_acceptance_rate"] == 15 / 24


def test_no_speculative_figures_until_vllm_drafts() -> None:
    figures = Figures()
    figures.record(scheduler_stats(running=2), preempted(0))
    assert not any(name.startswith("spec_") for name in figures.stats())


def test_the_registry_and_metrics_show_preemptions_and_acceptance(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    figures = Figures()
    figures.record(scheduler_stats(running=3, waiting=2, spec=(5, 20, 15)), preempted(4))
    engine = ScriptedEngine()
    engine.stats = figures.stats  # type: ignore[method-assign]
    metrics = WorkerMetrics("m")
    service = WorkerService(engine, fake_redis, Settings(), "m", "w1", metrics)
    shown: dict[str, Any] = service.figures()
    service.close()
    assert (shown["waiting"], shown["preemptions"], shown["spec_acceptance_rate"]) == (2, 4, 0.75)
    body = metrics.render().decode()
    assert 'tokenq:num_preemptions_total{model="m"} 4.0' in body
    assert 'tokenq:spec_decode_num_accepted_tokens_total{model="m"} 15.0' in body
    assert 'tokenq:spec_decode_acceptance_rate{model="m"} 0.75' in body


def test_claims_fill_the_batch_and_the_look_ahead() -> None:
    figures = Figures()
    assert figures.num_free_slots(MAX_NUM_SEQS, 0, resumed=False) == MAX_NUM_SEQS + NUM_LOOKAHEAD
    assert figures.num_free_slots(MAX_NUM_SEQS, MAX_NUM_SEQS, resumed=False) == NUM_LOOKAHEAD
    assert figures.num_free_slots(MAX_NUM_SEQS, MAX_NUM_SEQS + NUM_LOOKAHEAD, resumed=False) == 0


def test_no_new_claims_while_vllm_has_a_queue_or_a_full_kv_cache() -> None:
    queued, full = Figures(), Figures()
    queued.record(scheduler_stats(running=4, waiting=NUM_LOOKAHEAD + 1), None)
    full.record(scheduler_stats(running=4, kv_cache_usage=KV_FULL), None)
    for figures in (queued, full):
        assert figures.num_free_slots(MAX_NUM_SEQS, 4, resumed=False) == 0
        # A resumed request's client is waiting: it is still taken, up to the room.
        assert figures.num_free_slots(MAX_NUM_SEQS, 4, resumed=True) == 4 + NUM_LOOKAHEAD
    calm = Figures()
    calm.record(scheduler_stats(running=4, waiting=NUM_LOOKAHEAD), None)
    assert calm.num_free_slots(MAX_NUM_SEQS, 4, resumed=False) == 4 + NUM_LOOKAHEAD
