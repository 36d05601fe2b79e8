"""Runs a step on the device: the only part of the engine that holds tensors.

It executes what the scheduler decided, never decides anything itself: holds the
paged KV cache (one pool of blocks per attention layer, allocated once) and, for a
hybrid model, the state slots of its other layers (``worker.engine.models.state``,
allocated once beside it), and each step builds its inputs on the host
(:class:`StepInputs`, one builder for every device and family), runs the model's
forward on the device through the device's attention backend (gather + SDPA on the
CPU, the paged kernel on CUDA, replayed as CUDA graphs where it can), then samples.
The three stages are separate calls, so that the host can prepare a step while the
device runs another: ``launch`` hands a step to the executor thread and returns at
once (``worker.engine.overlap``); ``execute`` runs one and returns its tokens.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import PreTrainedTokenizerBase

from worker.engine import prompt_logprobs
from worker.engine.compiled import CompiledLayers
from worker.engine.config import EngineConfig
from worker.engine.cpu_attention import CpuBackend
from worker.engine.cuda_graphs import PagedBackend, StepGraphs
from worker.engine.errors import UnsupportedModel
from worker.engine.generic_forward import GenericForward
from worker.engine.gguf_q8 import GgufInt8
from worker.engine.loader import load_model
from worker.engine.lora import LoraStore, lora_sites
from worker.engine.models.decoder import DecoderModel, ForwardBatch
from worker.engine.models.state import StateCache, state_bytes
from worker.engine.outputs import RunnerOutput, ScheduledSeq, SchedulerOutput
from worker.engine.overlap import (
    InFlight,
    StepResult,
    TimedDevice,
    timed_forward_token_ids,
    timed_pack,
    to_host,
)
from worker.engine.quantization import Prequantized, quantize_forward
from worker.engine.runner_support import (
    available_host_bytes,
    eos_token_ids,
    graphs_supported,
    num_kv_layers,
    pick_device,
    pick_dtype,
    state_shapes,
)
from worker.engine.sampler import GREEDY, Sampler, SamplingRow, sampling_row
from worker.engine.step_inputs import RopeLens, StepInputs, on_device
from worker.model_store import gguf_source

log = logging.getLogger(__name__)

# cuDNN's attention is left out: it builds a plan for each new shape, milliseconds of
# CPU time, and a step's context lengths are new every step.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

# The GIL switch interval while steps run on the executor thread (see ``launch``).
STEP_SWITCH_INTERVAL_S = 0.00005

__all__ = ["ModelRunner", "pick_device"]


class ModelRunner:
    def __init__(self, config: EngineConfig, model_path: str | Path, draft: bool = False) -> None:
        """``draft``: the runner of a speculative draft model, whose w8a8 rows go through
        their kernel together (``worker.engine.quantization.quantize_forward``)."""
        self.device = pick_device(config.device)
        self.dtype = pick_dtype(config.dtype, self.device)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        loaded = load_model(
            config.model, model_path, self.device, self.dtype, config.trust_remote_code
        )
        self.model: Any = loaded.model
        self.tokenizer: PreTrainedTokenizerBase = loaded.tokenizer
        if loaded.family is not None and loaded.family.state is not None and not config.fuse_layers:
            # transformers' forward keeps no state from one step to the next.
            raise UnsupportedModel(f"model {config.model}: a hybrid runs only fused")
        self.family = loaded.family if config.fuse_layers else None
        self.forward_fn = self._forward_fn(config)
        self.quantization = config.quantization
        quantize_forward(
            self.forward_fn,
            config.quantization,
            config.model,
            self._prequantized(config.quantization, model_path),
            rows_apart=not draft,
        )
        if config.compile:
            self._compile(config)
        text_config = self.model.config.get_text_config()
        self.max_model_len: int = config.max_model_len or text_config.max_position_embeddings
        self.rope_lens, self.recompute_at = self._rope_switch()
        self.num_layers: int = text_config.num_hidden_layers
        self.num_kv_layers = num_kv_layers(self.forward_fn, self.num_layers)
        self.state_shapes = state_shapes(self.forward_fn, self.dtype)  # a hybrid's
        self.num_kv_heads: int = getattr(text_config, "num_key_value_heads", None) or (
            text_config.num_attention_heads
        )
        self.head_dim: int = getattr(text_config, "head_dim", None) or (
            text_config.hidden_size // text_config.num_attention_heads
        )
        self.hidden_size: int = text_config.hidden_size
        self.eos_token_ids = eos_token_ids(self.model, self.tokenizer)
        self.sampler = Sampler(self.device)
        self.key_cache: list[torch.Tensor] = []
        self.value_cache: list[torch.Tensor] = []
        self.block_size = config.kv_block_size
        self.null_slot = self.scratch_slot = 0
        self.pooling = config.pooling
        self.paged = self.device.type == "cuda"
        self.use_graphs = (
            self.paged
            and not config.enforce_eager
            and isinstance(self.forward_fn, DecoderModel)
            and graphs_supported(self.forward_fn, self.device, self.dtype)
        )
        self.max_num_rows = config.num_seqs + config.max_num_resumed_seqs
        self.max_num_batched_tokens = config.num_batched_tokens
        self.backend: CpuBackend | PagedBackend | None = None
        self.graphs: StepGraphs | None = None
        self.state_cache: StateCache | None = None
        self.lora = self._lora_store(config)
        self.vocab_size: int = text_config.vocab_size
        timed_ms = config.timed_forward_ms
        self.timed_device = None if timed_ms is None else TimedDevice(timed_ms / 1000)
        self._executor: ThreadPoolExecutor | None = None

    def _forward_fn(self, config: EngineConfig) -> DecoderModel | GenericForward:
        """The fused forward of the model's family; transformers' own for a family with
        no description, only where the self-check will vouch for it."""
        if self.family is not None:
            return DecoderModel(self.model, self.family)
        model_type = self.model.config.get_text_config().model_type
        if not config.self_check:
            raise UnsupportedModel(
                f"model {config.model} ({model_type}): tokenq has no description of this family, "
                "and transformers' own forward serves only a model that passes the self-check "
                "(drop --no-self-check)"
            )
        log.warning(
            "model %s (%s): no fused description of this family; running transformers' own "
            "forward with tokenq's attention (slower; no CUDA graphs, no LoRA), if it passes "
            "the self-check",
            config.model,
            model_type,
        )
        return GenericForward(self.model)

    def _compile(self, config: EngineConfig) -> None:
        """The fused forward's layers compiled for small steps (``worker.engine.compiled``)."""
        if not isinstance(self.forward_fn, DecoderModel):
            raise UnsupportedModel(
                f"model {config.model}: --compile needs the fused forward of a family tokenq "
                "describes; serve it without --compile"
            )
        compiled = CompiledLayers(self.forward_fn, config.model, config.compile_max_tokens)
        compiled.compile()
        self.forward_fn.compiled = compiled

    def _prequantized(self, method: str | None, model_path: str | Path) -> Prequantized | None:
        """For int8 and w8a8: the weights a GGUF file the model came from holds in Q8_0,
        read straight from their blocks (``worker.engine.gguf_q8``)."""
        source = gguf_source(model_path) if method is not None else None
        if source is None:
            return None
        return GgufInt8(source, self.model).weight_for

    def _rope_switch(self) -> tuple[RopeLens, int | None]:
        """What a step tells the rotary of each token's length, and the length at which
        the scheduler recomputes a sequence whole (see ``worker.engine.models.rotary``)."""
        if not isinstance(self.forward_fn, DecoderModel) or self.family is None:
            return None, None
        switch = self.forward_fn.rotary.switch_len(self.max_model_len)
        if switch is None:
            return None, None
        if self.family.recompute_on_rope_switch:
            return "sequence", switch
        return "prompt", None

    def _lora_store(self, config: EngineConfig) -> LoraStore | None:
        """Adapters apply through the fused forward's projections only (not yet a
        hybrid's: its layers are not all alike)."""
        if self.family is None or config.max_loras == 0:
            return None
        if self.family.state is not None:
            log.info("LoRA adapters are not served on hybrid models (%s)", self.family.name)
            return None
        layers = self.model.get_decoder().layers
        sites = lora_sites(self.family, layers[0])
        args = (config.max_loras, config.max_lora_rank, self.device, self.dtype)
        return LoraStore(sites, self.num_layers, *args)

    @property
    def kv_bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_kv_layers * self.num_kv_heads * self.head_dim * itemsize

    @property
    def state_bytes_per_seq(self) -> int:
        """What one sequence's state slot takes (0: the model keeps no state)."""
        return state_bytes(self.state_shapes)

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes the cache tensors take (on the CPU, pages are committed as blocks
        are first written)."""
        return sum(t.numel() * t.element_size() for t in (*self.key_cache, *self.value_cache))

    def allocate_kv_cache(self, num_blocks: int, num_state_slots: int = 0) -> None:
        """The pool: ``num_blocks`` blocks per attention layer, plus one block of zeros
        that pads decode rows to a common length and one scratch block that padding
        tokens write to (neither is ever handed out); and a hybrid's state slots."""
        self.null_slot = num_blocks * self.block_size
        self.scratch_slot = self.null_slot + self.block_size
        num_slots = self.scratch_slot + self.block_size
        self.key_cache = [self._empty_pool(num_slots) for _ in range(self.num_kv_layers)]
        self.value_cache = [self._empty_pool(num_slots) for _ in range(self.num_kv_layers)]
        log.info(
            "KV cache: %d blocks of %d tokens, %d MiB",
            num_blocks,
            self.block_size,
            self.kv_cache_bytes >> 20,
        )
        if self.state_shapes:
            self.state_cache = StateCache(self.state_shapes, num_state_slots, self.device)
        if self.paged:
            self.backend = PagedBackend(self.key_cache, self.value_cache, self.block_size)
        else:
            windows = {s.window for s in getattr(self.forward_fn, "specs", [])}
            if isinstance(self.forward_fn, GenericForward):
                windows |= _config_windows(self.model)
            cache = (self.key_cache, self.value_cache)
            self.backend = CpuBackend(*cache, self.block_size, self.null_slot, windows)
        if self.use_graphs:
            self._capture_graphs()

    def _capture_graphs(self) -> None:
        assert isinstance(self.backend, PagedBackend)
        started = time.perf_counter()
        self.graphs = StepGraphs(
            self.forward_fn,
            self.backend,
            self.max_num_batched_tokens,
            self.max_num_rows,
            -(-self.max_model_len // self.block_size),
            self.scratch_slot,
            self.state_cache,
        )
        with torch.inference_mode():
            self.graphs.capture()
        log.info(
            "captured %d CUDA graphs (steps of 1 to %d tokens) in %.1f s",
            len(self.graphs.sizes),
            self.graphs.sizes[-1],
            time.perf_counter() - started,
        )

    def _empty_pool(self, num_slots: int) -> torch.Tensor:
        # Empty, not zeros: every slot a step reads was written first, but for the
        # padding block; so on the CPU the pool's pages are committed only when used.
        shape = (num_slots, self.num_kv_heads, self.head_dim)
        cache = torch.empty(shape, dtype=self.dtype, device=self.device)
        cache[self.null_slot :].zero_()
        return cache

    def num_free_bytes(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free)
        return available_host_bytes()

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        """The step run to its end on this thread (the speculator's steps)."""
        return self.launch(out, None, in_thread=True).result()

    def launch(
        self, out: SchedulerOutput, prev: InFlight | None, in_thread: bool = False
    ) -> InFlight:
        """Build the step's inputs here and queue it after the step ``prev`` (whose
        sampled ids fill this step's pending tokens): on a device that runs it by itself,
        or ``in_thread`` (a synchronous engine's step), from this thread; for the CPU's
        forward, on the executor thread. Returns before the step ends, except in thread."""
        inputs = self.prepare(out.scheduled)
        rows, errors = self._sampling_rows(out.sampled)
        before = None if prev is None else prev.future
        run = partial(self._run_after, inputs, rows, errors, before)
        if in_thread or self.timed_device is not None or self.device.type == "cuda":
            # The device runs the step by itself once queued (a CUDA stream, the timed
            # forward's clock), so this thread queues it: an executor thread would only
            # wait for the GIL this thread's Python holds, at each of its launches.
            future = _ran(run)
        else:  # the CPU's forward computes on the executor thread while this one goes on
            _own_histories(rows)
            future = self._step_thread().submit(run)
        return InFlight(out, rows, future)

    def _step_thread(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenq-step")
            # The step thread needs the GIL for a moment as a step ends (its result) and
            # starts (its tensors) while the host thread runs Python: at CPython's default
            # 5 ms switch interval that moment would wait a whole interval, every step.
            sys.setswitchinterval(min(sys.getswitchinterval(), STEP_SWITCH_INTERVAL_S))
        return self._executor

    def _run_after(
        self,
        inputs: StepInputs,
        rows: list[SamplingRow],
        errors: dict[int, str],
        before: Future[StepResult] | None,
    ) -> StepResult:
        # The executor runs one step at a time in launch order: ``before`` is done.
        prev_ids = None if before is None else before.result().token_ids
        return self.run_step(inputs, rows, prev_ids, errors)

    def run_step(
        self,
        inputs: StepInputs,
        rows: list[SamplingRow],
        prev_ids: torch.Tensor | None = None,
        errors: dict[int, str] | None = None,
    ) -> StepResult:
        """Forward and sample; the host's copy of the ids is under way when it returns.
        Rows whose own part failed are named in ``errors`` (their tokens are void)."""
        errors = {} if errors is None else errors
        with torch.inference_mode(), sdpa_kernel(SDPA_BACKENDS):
            prompt = None  # the timed forward scores no prompt: such requests end in error
            if self.timed_device is not None:
                token_ids = self._timed_forward(inputs, prev_ids)
                packed, pooled = timed_pack(token_ids, rows), []
            else:
                logits, hidden = self.forward(inputs, prev_ids)
                num_sampled = len(inputs.sample_index)
                token_ids, packed = self.sampler.sample(logits[:num_sampled], rows, errors)
                pooled = self._pool(hidden, inputs.pool_lengths)
                prompt = self._prompt_scores(logits[num_sampled:], inputs)
            host, ready = to_host(packed)
            if prompt is not None:  # copied after the ids: its event marks both done
                prompt, ready = to_host(prompt)
        if self.timed_device is not None:
            ready = self.timed_device.run()  # the step's end, which reading it waits for
        return StepResult(token_ids, host, pooled, ready, errors, prompt, inputs.prompt_spans)

    def _prompt_scores(self, logits: torch.Tensor, inputs: StepInputs) -> torch.Tensor | None:
        """The scored prompt tokens' packed logprobs (``worker.engine.prompt_logprobs``)."""
        if not inputs.prompt_index:
            return None
        num_top = max(num_top for _, num_top in inputs.prompt_spans)
        return prompt_logprobs.pack(logits, self._tensor(inputs.prompt_targets), num_top)

    def _timed_forward(self, inputs: StepInputs, prev_ids: torch.Tensor | None) -> torch.Tensor:
        """The timed forward's ids (a hash of each sampling row's last token); its wait
        is the ``TimedDevice``'s."""
        token_ids = self._token_tensor(inputs, prev_ids)
        index = self._tensor(inputs.sample_index)
        positions = self._tensor(inputs.positions)[index]
        return timed_forward_token_ids(token_ids[index], positions, self.vocab_size)

    def _token_tensor(self, inputs: StepInputs, prev_ids: torch.Tensor | None) -> torch.Tensor:
        """The step's token ids on the device, its pending ones from ``prev_ids``."""
        token_ids = self._tensor(inputs.token_ids)
        pending = self._pending(inputs, prev_ids)
        if pending is not None:
            index, pending_ids = pending
            token_ids[index] = pending_ids
        return token_ids

    def prepare(self, scheduled: list[ScheduledSeq]) -> StepInputs:
        """The step's inputs, on the host."""
        return StepInputs.build(scheduled, self.block_size, self.rope_lens)

    def forward(
        self, inputs: StepInputs, prev_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits of the sampling rows and final hidden states of the pooling rows: a
        captured graph's replay where one fits, else an eager forward. Pending tokens
        come from ``prev_ids``, the step before's sampled ids on the device."""
        lora = self._lora_batch(inputs)  # a step with adapters runs eagerly
        if lora is None and self.graphs is not None and self._graph_fits(inputs):
            return self.graphs.run(inputs, self._pending(inputs, prev_ids)), None
        assert self.backend is not None, "allocate_kv_cache first"
        batch = ForwardBatch(
            self._token_tensor(inputs, prev_ids),
            self._tensor(inputs.positions),
            self._tensor(inputs.sample_index + inputs.prompt_index),  # sampling rows first
            self.backend.step(inputs),
            self._tensor(inputs.pool_index) if inputs.pool_index else None,
            inputs.rope_lens,
            lora,
            None if self.state_cache is None else self.state_cache.step(inputs),
        )
        logits, hidden = self.forward_fn(batch)
        return logits, hidden

    def logits(self, scheduled: list[ScheduledSeq]) -> torch.Tensor:
        """The sampling rows' logits for ``scheduled``, as a step would compute them: a
        copy, since a replayed graph's output buffer is the next step's too."""
        with torch.inference_mode(), sdpa_kernel(SDPA_BACKENDS):
            return self.forward(self.prepare(scheduled))[0].clone()

    def _graph_fits(self, inputs: StepInputs) -> bool:
        assert self.graphs is not None and isinstance(self.forward_fn, DecoderModel)
        rotary = self.forward_fn.rotary
        return (
            self.graphs.can_run(inputs)
            and rotary.base_only(inputs.rope_lens)
            and not inputs.prompt_index  # a graph's logits are the sampling rows' only
        )

    def _lora_batch(self, inputs: StepInputs) -> Any:
        if self.lora is None:
            return None
        return self.lora.batch(inputs.loras, inputs.row_num_tokens)

    def _pool(self, hidden: torch.Tensor | None, lengths: list[int]) -> list[list[float]]:
        """Each pooling chunk's reduction (see ``worker.engine.pooling``), in one copy."""
        if hidden is None:
            return []
        chunks = torch.split(hidden.float(), lengths)
        if self.pooling == "mean":
            reduced = [chunk.sum(dim=0) for chunk in chunks]
        else:
            reduced = [chunk[-1 if self.pooling == "last" else 0] for chunk in chunks]
        values: list[list[float]] = torch.stack(reduced).tolist()
        return values

    def _sampling_rows(
        self, sampled: list[ScheduledSeq]
    ) -> tuple[list[SamplingRow], dict[int, str]]:
        """Each sampled item's row; one that cannot be built fails its request alone
        (a greedy row stands in, and its token is void)."""
        rows, errors = [], {}
        for at, item in enumerate(sampled):
            try:
                rows.append(self._sampling_row(item))
            except Exception as e:
                errors[at] = f"internal error: its sampling parameters could not be applied: {e!r}"
                rows.append(SamplingRow(GREEDY, 0, item.seq.token_ids))
        return rows, errors

    def _pending(
        self, inputs: StepInputs, prev_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where the pending tokens go in the step, and their ids on the device."""
        if not inputs.pending_index:
            return None
        if prev_ids is None:
            raise RuntimeError("a step with pending tokens needs the step before's ids")
        return self._tensor(inputs.pending_index), prev_ids[self._tensor(inputs.pending_rows)]

    def _sampling_row(self, item: ScheduledSeq) -> SamplingRow:
        return sampling_row(item.seq, self.eos_token_ids)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return on_device(values, torch.long, self.device)


def _config_windows(model: Any) -> set[int | None]:
    """Window sizes transformers may ask of the fallback's attention."""
    config = model.config.get_text_config()
    return {getattr(config, "sliding_window", None), None}


def _own_histories(rows: list[SamplingRow]) -> None:
    """A copy of each history the sampler reads, for a step that runs later on another
    thread: the host goes on changing the sequences' tokens meanwhile."""
    for row in rows:
        params = row.params
        if params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
            row.history = list(row.history)


def _ran(call: Callable[[], StepResult]) -> Future[StepResult]:
    """``call``'s result (or its exception) as a done future."""
    future: Future[StepResult] = Future()
    try:
        future.set_result(call())
    except Exception as e:  # read by the engine as the step's failure, as a thread's is
        future.set_exception(e)
    return future
