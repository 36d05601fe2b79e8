"""vLLM's scheduler figures, kept as each step reports them (a vLLM stat logger)."""

from __future__ import annotations

from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase


class Figures:
    """The latest running and waiting counts and KV use, and running totals of prefix
    cache queries and hits, preemptions and speculative tokens drafted and accepted."""

    def __init__(self) -> None:
        self.num_running = 0
        self.num_waiting = 0
        self.kv_cache_usage = 0.0
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0
        self.num_preemptions = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    def factory(self, vllm_config: Any, engine_index: int = 0) -> StatLoggerBase:
        """What ``LLMEngine`` takes as a stat logger factory: a logger that records here."""
        return _Recorder(self)

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            self.num_running = scheduler_stats.num_running_reqs
            self.num_waiting = scheduler_stats.num_waiting_reqs
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            prefix = scheduler_stats.prefix_cache_stats
            self.num_prefix_queried_tokens += prefix.queries
            self.num_prefix_hit_tokens += prefix.hits
            spec = scheduler_stats.spec_decoding_stats
            if spec is not None:
                self.num_draft_tokens += spec.num_draft_tokens
                self.num_accepted_tokens += spec.num_accepted_tokens
        if iteration_stats is not None:
            self.num_preemptions += iteration_stats.num_preempted_reqs

    def stats(self) -> dict[str, float]:
        """The worker's figures, named as the built-in engine names them."""
        return {
            "running": self.num_running,
            "waiting": self.num_waiting,
            "kv_cache_usage": self.kv_cache_usage,
            "preemptions": self.num_preemptions,
            "prefix_cache_queries": self.num_prefix_queried_tokens,
            "prefix_cache_hits": self.num_prefix_hit_tokens,
            "spec_draft_tokens": self.num_draft_tokens,
            "spec_accepted_tokens": self.num_accepted_tokens,
        }


class _Recorder(StatLoggerBase):  # type: ignore[misc]  # vLLM's class: Any to mypy
    def __init__(self, figures: Figures) -> None:
        self.figures = figures

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        self.figures.record(scheduler_stats, iteration_stats)

    def log_engine_initialized(self) -> None:
        pass
