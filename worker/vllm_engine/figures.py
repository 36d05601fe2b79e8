"""vLLM's scheduler figures, kept as each step reports them, and how many requests the
worker claims from them. Plain Python: vLLM's stat logger that feeds it is in
``stat_logger``, imported only where vLLM runs."""

from __future__ import annotations

from typing import Any

from worker.engine.speculative.stats import SpecStats

# Requests claimed beyond vLLM's batch, so a more urgent one waits in its scheduler and
# can preempt (as the built-in engine's look-ahead).
NUM_LOOKAHEAD = 2
# A KV cache this full takes no new request (resumed ones still: their clients wait).
KV_FULL = 0.95


class Figures:
    """The latest running and waiting counts and KV use, and running totals of prefix
    cache queries and hits, preemptions and speculative drafts and acceptances."""

    def __init__(self) -> None:
        self.num_running = 0
        self.num_waiting = 0
        self.kv_cache_usage = 0.0
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0
        self.num_preemptions = 0
        self.spec = SpecStats()

    def factory(self, vllm_config: Any, engine_index: int = 0) -> Any:
        """What ``LLMEngine`` takes as a stat logger factory: a logger that records here."""
        from worker.vllm_engine.stat_logger import Recorder  # vLLM's class: vLLM loads here

        return Recorder(self)

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        """One step's ``SchedulerStats`` and ``IterationStats`` (either may be None)."""
        if scheduler_stats is not None:
            self.num_running = scheduler_stats.num_running_reqs
            self.num_waiting = scheduler_stats.num_waiting_reqs
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            prefix = scheduler_stats.prefix_cache_stats
            self.num_prefix_queried_tokens += prefix.queries
            self.num_prefix_hit_tokens += prefix.hits
            spec = scheduler_stats.spec_decoding_stats
            if spec is not None:
                self.spec.num_drafts += spec.num_drafts
                self.spec.num_draft_tokens += spec.num_draft_tokens
                self.spec.num_accepted_tokens += spec.num_accepted_tokens
        if iteration_stats is not None:
            self.num_preemptions += iteration_stats.num_preempted_reqs

    def stats(self) -> dict[str, float]:
        """The worker's figures, named as the built-in engine names them (its
        speculative ones only once vLLM has drafted)."""
        return {
            "running": self.num_running,
            "waiting": self.num_waiting,
            "kv_cache_usage": self.kv_cache_usage,
            "preemptions": self.num_preemptions,
            "prefix_cache_queries": self.num_prefix_queried_tokens,
            "prefix_cache_hits": self.num_prefix_hit_tokens,
            **(self.spec.figures() if self.spec.num_drafts else {}),
        }

    def num_free_slots(self, max_num_seqs: int, num_held: int, resumed: bool) -> int:
        """How many more requests to claim while ``num_held`` are in vLLM: what its batch
        has room for, plus a small look-ahead; no new one while its KV cache is nearly
        full or more than the look-ahead already wait in its scheduler (resumed ones
        still, up to the room: their clients wait)."""
        room = max(0, max_num_seqs + NUM_LOOKAHEAD - num_held)
        if resumed:
            return room
        if self.kv_cache_usage >= KV_FULL or self.num_waiting > NUM_LOOKAHEAD:
            return 0
        return room
