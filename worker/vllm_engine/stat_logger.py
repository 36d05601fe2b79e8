"""vLLM's stat logger that records each step's figures in ``figures.Figures``."""

from __future__ import annotations

from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from worker.vllm_engine.figures import Figures


class Recorder(StatLoggerBase):  # type: ignore[misc]  # vLLM's class: Any to mypy
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
