"""Engine settings, chosen by the operator; a setting left at ``None`` takes the
default of the device the engine runs on (``EngineConfig.for_device``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from worker.engine.pooling import POOLING_METHODS
from worker.engine.speculative.config import SpeculativeConfig

# Weight quantizations the built-in engine applies at load (``worker.engine.quantization``).
QUANTIZATION_METHODS = ("int8", "w8a8")

# With every row of the batch taken, the look-ahead is claimed for this many at a time
# (``EngineConfig.num_to_claim``).
LOOKAHEAD_REFILL = 2


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs; checked when made, and fixed after. A field with a ``help``
    is an option of `tokenq worker` too (``worker.flags``), declared here only.

    The KV cache is one pool of ``kv_block_size``-token blocks, allocated once:
    ``kv_cache_mib`` of it, or with ``None`` the ``kv_cache_share`` of the memory
    free at start-up; a hybrid model's state slots come out of the same budget
    (``worker.engine.state_slots``). ``enable_prefix_caching`` lets a request reuse the cached
    blocks of any earlier request's identical prefix. ``prefill_chunk_tokens``
    caps how many prompt tokens one request computes per step (``None``: only the
    step's token budget limits it). With ``enable_aging``, a waiting request gains
    one priority point every ``aging_interval_s`` seconds (up to the top level), so
    low priority is never starved forever; it is off by default so that priority
    stays strict. ``fuse_layers`` runs a model of a described family
    (``worker.engine.models``) through the fused forward; off, through transformers'
    own (which must then pass the self-check).
    A waiting request of ``ttft_priority`` or more (default: critical) gets its
    prefill in a short step of its own while the engine is busy, so its first token
    does not wait for a whole batch of decodes (``None`` turns this off).
    ``max_num_resumed_seqs`` more rows are kept for requests resumed after their
    worker died: a client is reading each of them mid-answer, so they join the batch
    at once even when it is full of new work (the KV pool still bounds memory).
    ``pooling`` turns an embed request's final hidden states into its embedding
    (``mean``, ``last`` or ``cls``; normalised either way). On CUDA a step runs as
    a captured CUDA graph (one per token-count bucket) unless ``enforce_eager``.
    Up to ``max_loras`` LoRA adapters of rank up to ``max_lora_rank`` are resident
    at once (0: none served).

    ``max_model_len`` caps the tokens one request may hold (default: the model's
    ``max_position_embeddings``). ``trust_remote_code`` lets a model run code from
    its own repository. With ``self_check`` (on by default), the engine compares its
    logits on a short probe with transformers' own forward at start-up and refuses
    to serve a model whose logits differ beyond the dtype's tolerance
    (``worker.engine.self_check``).

    With ``async_scheduling`` the host schedules step N+1, builds its inputs and
    post-processes step N-1 while step N runs; sampled ids feed the next step on the
    device (``worker.engine.overlap``). On CUDA and the timed forward it is on unless
    set off (the host's work then hides behind the device's; docs/benchmarks.md has the
    figures); on the CPU's own forward it is off unless set on (``CPU_DEFAULTS``).
    ``timed_forward_ms`` replaces the model's forward with a wait of that long that
    does not hold the GIL and returns deterministic token ids, everything else real:
    a device-like forward on the CPU, for benchmarks and tests of the host's share of
    a step.

    ``speculative_config`` turns on speculative decoding (n-gram or draft-model
    proposals verified in one forward; ``worker.engine.speculative``); it runs steps
    synchronously.

    With ``compile``, a step of up to ``compile_max_tokens`` tokens runs through the
    decoder's layers compiled by inductor on the CPU (``worker.engine.compiled``).

    ``quantization="int8"`` keeps the projections of a described family's layers in
    8 bits with a scale per output channel, quantized at load on the CPU
    (``worker.engine.quantization``); ``"w8a8"`` also quantizes each row's activations
    to 8 bits as they enter a projection; ``None`` serves the checkpoint's own dtype.

    ``max_num_seqs``, ``max_num_batched_tokens`` and ``kv_cache_share`` left at
    ``None`` take the device's defaults: a small CPU box (64 rows, 512 tokens a
    step, 30% of free memory) or a GPU (256 rows as vLLM uses, 2048 tokens a step,
    80% of the GPU memory free once the weights are loaded).
    """

    model: str
    device: str = field(
        default="auto",
        metadata={"help": "auto (CUDA if there is a GPU, else the CPU), cpu, cuda or cuda:N"},
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "auto (bfloat16 on CUDA, float32 on the CPU), float32, bfloat16 or float16"
        },
    )
    max_num_seqs: int | None = field(default=None, metadata={"help": "most requests in a batch"})
    max_num_batched_tokens: int | None = None
    kv_cache_mib: int | None = field(
        default=None, metadata={"help": "KV cache budget in MiB (a hybrid's state slots too)"}
    )
    kv_cache_share: float | None = None
    kv_block_size: int = 16
    enable_prefix_caching: bool = True
    prefill_chunk_tokens: int | None = None
    enable_aging: bool = False
    aging_interval_s: float = 1.0
    num_lookahead_slots: int = 4
    max_num_resumed_seqs: int = 16
    num_threads: int | None = field(
        default=None,
        metadata={
            "help": "built-in engine: CPU threads for the forward (default: torch's, "
            "OMP_NUM_THREADS or one a core)"
        },
    )
    fuse_layers: bool = True
    ttft_priority: int | None = 100
    max_model_len: int | None = field(
        default=None,
        metadata={"help": "most tokens one request may hold (default: the model's context)"},
    )
    pooling: str = field(
        default="mean",
        metadata={"help": "how embeddings pool the last hidden state: mean, last or cls"},
    )
    enforce_eager: bool = field(
        default=False, metadata={"help": "on CUDA, run every step eagerly (no CUDA graphs)"}
    )
    max_loras: int = field(
        default=4,
        metadata={"help": "LoRA adapters resident at once (0: claims no adapter requests)"},
    )
    max_lora_rank: int = field(
        default=16, metadata={"help": "the largest adapter rank it loads (and claims requests of)"}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "let the model run code from its own repository"}
    )
    self_check: bool = field(
        default=True,
        metadata={
            "help": "at start-up, compare the engine's logits with transformers' and refuse to "
            "serve a model that differs"
        },
    )
    # Structured outputs: grammars compile on this many threads, so one large schema
    # does not hold the others behind it; one still compiling after the time limit
    # ends its requests with an error naming the limit.
    grammar_compile_threads: int = field(
        default=4, metadata={"help": "threads compiling structured-output grammars"}
    )
    grammar_compile_timeout_s: float = field(
        default=10.0, metadata={"help": "a grammar still compiling after this ends its requests"}
    )
    async_scheduling: bool | None = field(
        default=None,
        metadata={
            "help": "schedule the next step while one runs (off: wait for each step); default: on "
            "on CUDA and the timed forward, off on the CPU's own forward"
        },
    )
    timed_forward_ms: float | None = field(
        default=None,
        metadata={
            "help": "benchmarks: the model's forward replaced by a wait of this long "
            "(deterministic tokens, not the model's)"
        },
    )
    quantization: str | None = field(
        default=None,
        metadata={
            "help": "int8: keep the projections' weights in 8 bits (CPU; the built-in engine); "
            "w8a8: the same weights, and each row's activations in 8 bits too (faster, "
            "agrees less with fp32; CPUs with VNNI); default: the checkpoint's dtype"
        },
    )
    compile: bool = field(
        default=False,
        metadata={
            "help": "built-in engine on the CPU: run steps of up to --compile-max-tokens tokens "
            "through layers compiled by torch's inductor (at start-up, cached on disk); "
            "default: off"
        },
    )
    compile_max_tokens: int = field(
        default=8, metadata={"help": "the most tokens a step run through --compile has"}
    )
    # Speculative decoding (``worker.engine.speculative``); None: off. Offered on the
    # command line as ``WorkerOptions.speculative_config`` (JSON, both engines).
    speculative_config: SpeculativeConfig | None = None

    def num_to_claim(self, max_num_seqs: int, num_held: int) -> int:
        """How many new requests to claim beside the ``num_held`` the engine holds
        (running, waiting or compiling; resumed ones aside): up to the batch and its
        look-ahead. While a row of the batch is idle, whatever fits; once every row is
        taken, the look-ahead is refilled ``LOOKAHEAD_REFILL`` at a time, not one
        request a claim: each claim costs Redis two round trips (claim.lua on the
        model's slot, start.lua on the requests'), and a request waiting in the
        look-ahead takes the row a finished one frees without one."""
        free = max_num_seqs + self.num_lookahead_slots - num_held
        if num_held < max_num_seqs or free >= min(LOOKAHEAD_REFILL, self.num_lookahead_slots):
            return max(0, free)
        return 0

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must name a model or a path, got an empty string")
        # None means the device's default; a value set must be valid (the message
        # speaks to the operator who set it).
        if self.max_num_seqs is not None:
            _at_least("max_num_seqs", self.max_num_seqs, 1)
        if self.max_num_batched_tokens is not None:
            _at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _at_least("kv_cache_mib", self.kv_cache_mib, 1, optional=True)
        _at_least("kv_block_size", self.kv_block_size, 1)
        _at_least("prefill_chunk_tokens", self.prefill_chunk_tokens, 1, optional=True)
        _at_least("num_lookahead_slots", self.num_lookahead_slots, 0)
        _at_least("max_num_resumed_seqs", self.max_num_resumed_seqs, 0)
        _at_least("num_threads", self.num_threads, 1, optional=True)
        _at_least("ttft_priority", self.ttft_priority, 0, optional=True)
        _at_least("max_model_len", self.max_model_len, 2, optional=True)
        _at_least("max_loras", self.max_loras, 0)
        _at_least("max_lora_rank", self.max_lora_rank, 1)
        _at_least("grammar_compile_threads", self.grammar_compile_threads, 1)
        _at_least("compile_max_tokens", self.compile_max_tokens, 1)
        if not self.grammar_compile_timeout_s > 0:
            raise ValueError(
                f"grammar_compile_timeout_s must be above 0, got {self.grammar_compile_timeout_s}"
            )
        if self.kv_cache_share is not None and not 0 < self.kv_cache_share <= 1:
            raise ValueError(f"kv_cache_share must be in (0, 1], got {self.kv_cache_share}")
        if self.pooling not in POOLING_METHODS:
            raise ValueError(
                f"pooling must be one of {', '.join(POOLING_METHODS)}, got {self.pooling!r}"
            )
        if self.timed_forward_ms is not None and not self.timed_forward_ms > 0:
            raise ValueError(
                f"timed_forward_ms must be above 0 or None, got {self.timed_forward_ms}"
            )
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(
                f"quantization must be one of {', '.join(QUANTIZATION_METHODS)} or None, "
                f"got {self.quantization!r}"
            )
        spec = self.speculative_config
        if spec is not None and spec.quantization not in (None, *QUANTIZATION_METHODS):
            raise ValueError(
                "speculative_config: quantization (the draft model's, at load) must be one of "
                f"{', '.join(QUANTIZATION_METHODS)}, got {spec.quantization!r}; leave it out "
                "for a draft checkpoint that is quantized already"
            )
        if self.speculative_config is not None and self.async_scheduling:
            raise ValueError(
                "speculative_config needs synchronous steps (a step's drafts are verified "
                "before the next is scheduled): leave async_scheduling unset or off"
            )
        if not self.aging_interval_s > 0:
            raise ValueError(f"aging_interval_s must be above 0, got {self.aging_interval_s}")

    def for_device(self, device_type: str) -> EngineConfig:
        """This config with each setting left at ``None`` filled in for ``device_type``.
        The CPU schedules asynchronously only on the timed forward, which stands for a
        device's (see ``CPU_DEFAULTS``)."""
        defaults = CUDA_DEFAULTS if device_type == "cuda" else CPU_DEFAULTS
        if device_type != "cuda" and self.timed_forward_ms is not None:
            defaults = {**defaults, "async_scheduling": True}
        if self.speculative_config is not None:  # verified before the next step is scheduled
            defaults = {**defaults, "async_scheduling": False}
        unset = {name: value for name, value in defaults.items() if getattr(self, name) is None}
        return replace(self, **unset)

    @property
    def num_seqs(self) -> int:
        """``max_num_seqs`` of a config made for its device."""
        return _resolved("max_num_seqs", self.max_num_seqs)

    @property
    def num_batched_tokens(self) -> int:
        return _resolved("max_num_batched_tokens", self.max_num_batched_tokens)

    @property
    def cache_share(self) -> float:
        share = self.kv_cache_share
        if share is None:
            raise RuntimeError("kv_cache_share is set by EngineConfig.for_device")
        return share


# The CPU's own forward computes on the cores the host's work needs: run on an executor
# thread beside the loop (asynchronous scheduling), its OpenMP team and the loop
# thread's spin share the same cores, so the CPU schedules synchronously by default
# (bench/engine.py --quick compares them; docs/benchmarks.md).
CPU_DEFAULTS: dict[str, Any] = {
    "async_scheduling": False,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 512,
    "kv_cache_share": 0.3,
}
CUDA_DEFAULTS: dict[str, Any] = {
    "async_scheduling": True,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 2048,
    "kv_cache_share": 0.8,
}


def _resolved(name: str, value: int | None) -> int:
    if value is None:
        raise RuntimeError(f"{name} is set by EngineConfig.for_device")
    return value


def _at_least(name: str, value: int | None, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        allowed = f"an integer of at least {minimum}" + (" or None" if optional else "")
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
