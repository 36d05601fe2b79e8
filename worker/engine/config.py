"""Engine settings, chosen by the operator; the defaults suit a small CPU box."""

from __future__ import annotations

from dataclasses import dataclass

from worker.engine.pooling import POOLING_METHODS


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs; checked when made, and fixed after.

    The KV cache is one pool of ``kv_block_size``-token blocks, allocated once:
    ``kv_cache_mib`` of it, or with ``None`` the ``kv_cache_share`` of the memory
    free at start-up. ``enable_prefix_caching`` lets a request reuse the cached
    blocks of any earlier request's identical prefix. ``prefill_chunk_tokens``
    caps how many prompt tokens one request computes per step (``None``: only the
    step's token budget limits it). With ``enable_aging``, a waiting request gains
    one priority point every ``aging_interval_s`` seconds (up to the top level), so
    low priority is never starved forever; it is off by default so that priority
    stays strict. ``fuse_layers`` runs Llama-shaped models through a fused forward.
    A waiting request of ``ttft_priority`` or more (default: critical) gets its
    prefill in a short step of its own while the engine is busy, so its first token
    does not wait for a whole batch of decodes (``None`` turns this off).
    ``max_num_resumed_seqs`` more rows are kept for requests resumed after their
    worker died: a client is reading each of them mid-answer, so they join the batch
    at once even when it is full of new work (the KV pool still bounds memory).
    ``pooling`` turns an embed request's final hidden states into its embedding
    (``mean``, ``last`` or ``cls``; normalised either way).
    """

    model: str
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    kv_cache_mib: int | None = None
    kv_cache_share: float = 0.3
    kv_block_size: int = 16
    enable_prefix_caching: bool = True
    prefill_chunk_tokens: int | None = None
    enable_aging: bool = False
    aging_interval_s: float = 1.0
    num_lookahead_slots: int = 4
    max_num_resumed_seqs: int = 16
    num_threads: int | None = None
    fuse_layers: bool = True
    ttft_priority: int | None = 100
    max_model_len: int | None = None
    pooling: str = "mean"

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must name a model or a path, got an empty string")
        _at_least("max_num_seqs", self.max_num_seqs, 1)
        _at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _at_least("kv_cache_mib", self.kv_cache_mib, 1, optional=True)
        _at_least("kv_block_size", self.kv_block_size, 1)
        _at_least("prefill_chunk_tokens", self.prefill_chunk_tokens, 1, optional=True)
        _at_least("num_lookahead_slots", self.num_lookahead_slots, 0)
        _at_least("max_num_resumed_seqs", self.max_num_resumed_seqs, 0)
        _at_least("num_threads", self.num_threads, 1, optional=True)
        _at_least("ttft_priority", self.ttft_priority, 0, optional=True)
        _at_least("max_model_len", self.max_model_len, 2, optional=True)
        if not 0 < self.kv_cache_share <= 1:
            raise ValueError(f"kv_cache_share must be in (0, 1], got {self.kv_cache_share}")
        if self.pooling not in POOLING_METHODS:
            raise ValueError(
                f"pooling must be one of {', '.join(POOLING_METHODS)}, got {self.pooling!r}"
            )
        if not self.aging_interval_s > 0:
            raise ValueError(f"aging_interval_s must be above 0, got {self.aging_interval_s}")


def _at_least(name: str, value: int | None, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        allowed = f"an integer of at least {minimum}" + (" or None" if optional else "")
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
