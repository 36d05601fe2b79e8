"""Engine settings, chosen by the operator; the defaults suit a small CPU box."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    """How the engine runs.

    ``kv_cache_mib`` bounds the KV cache the scheduler may hand out; ``None`` takes
    ``kv_cache_share`` of the memory free at start-up. ``prefill_chunk_tokens``
    caps how many prompt tokens one request computes per step (``None``: only the
    step's token budget limits it). With ``enable_aging``, a waiting request gains
    one priority point every ``aging_interval_s`` seconds (up to the top level), so
    low priority is never starved forever; it is off by default so that priority
    stays strict. A new request whose first ``min_prefix_reuse_tokens`` or more
    tokens match a running request's cached ones copies that prefix's keys and
    values instead of computing them (``None`` turns this off); ``fuse_layers``
    runs Llama-shaped models through a fused forward. A waiting request of
    ``ttft_priority`` or more (default: critical) gets its prefill in a short step
    of its own while the engine is busy, so its first token does not wait for a
    whole batch of decodes (``None`` turns this off).
    """

    model: str
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    kv_cache_mib: int | None = None
    kv_cache_share: float = 0.3
    kv_block_size: int = 16
    prefill_chunk_tokens: int | None = None
    enable_aging: bool = False
    aging_interval_s: float = 1.0
    num_lookahead_slots: int = 4
    num_threads: int | None = None
    fuse_layers: bool = True
    min_prefix_reuse_tokens: int | None = 8
    ttft_priority: int | None = 100
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}"
            )
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 1:
            raise ValueError(
                f"prefill_chunk_tokens must be at least 1 or None, got {self.prefill_chunk_tokens}"
            )
        if self.kv_cache_mib is not None and self.kv_cache_mib < 1:
            raise ValueError(f"kv_cache_mib must be at least 1 or None, got {self.kv_cache_mib}")
