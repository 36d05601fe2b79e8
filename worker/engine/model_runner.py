"""Runs a step on the device: the only part of the engine that holds tensors.

It executes what the scheduler decided, never decides anything itself: holds the
paged KV cache (one pool of blocks per layer, allocated once), builds the flattened
inputs, runs the model's forward (logits only for the rows that sample), and samples.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from worker.engine.attention import (
    ATTN_IMPLEMENTATION,
    DecodeGroup,
    PrefillChunk,
    StepBatch,
    group_by_length,
)
from worker.engine.config import EngineConfig
from worker.engine.cuda_graphs import PagedInputs, StepGraphs
from worker.engine.fused_llama import FusedLlama
from worker.engine.lora import LoraBatch, LoraStore, llama_sites
from worker.engine.outputs import RunnerOutput, ScheduledSeq, SchedulerOutput
from worker.engine.sampler import Sampler, SamplingRow, sampling_row

log = logging.getLogger(__name__)

# cuDNN's attention is left out: it builds a plan for each new shape, milliseconds of
# CPU time, and a step's context lengths are new every step.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class _Step(NamedTuple):
    """A step's inputs as tensors, and which rows of it sample and pool."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    logits_index: torch.Tensor
    pool_index: torch.Tensor | None
    pool_lengths: list[int]
    batch: StepBatch
    lora: LoraBatch | None = None  # rows with adapters: the step runs eagerly


class ModelRunner:
    def __init__(self, config: EngineConfig, model_path: str | Path) -> None:
        self.device = pick_device(config.device)
        self.dtype = _pick_dtype(config.dtype, self.device)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(model_path)
        self.model: Any = cast(
            Any,
            AutoModelForCausalLM.from_pretrained(
                model_path, dtype=self.dtype, attn_implementation=ATTN_IMPLEMENTATION
            ),
        )
        self.model.to(self.device).eval()
        self.fused = (
            FusedLlama(self.model)
            if config.fuse_layers and FusedLlama.supports(self.model)
            else None
        )
        text_config = self.model.config.get_text_config()
        self.num_layers: int = text_config.num_hidden_layers
        self.num_kv_heads: int = getattr(
            text_config, "num_key_value_heads", text_config.num_attention_heads
        )
        self.head_dim: int = getattr(text_config, "head_dim", None) or (
            text_config.hidden_size // text_config.num_attention_heads
        )
        self.max_model_len: int = config.max_model_len or text_config.max_position_embeddings
        self.eos_token_ids = _eos_token_ids(self.model, self.tokenizer)
        self.sampler = Sampler(self.device)
        self.key_cache: list[torch.Tensor] = []
        self.value_cache: list[torch.Tensor] = []
        self.block_size = config.kv_block_size
        self.null_slot = 0
        self.pooling = config.pooling
        self.hidden_size: int = text_config.hidden_size
        self._last_hidden: list[torch.Tensor] = []
        if self.fused is None:
            self.model.get_decoder().register_forward_hook(self._keep_hidden)
        # On CUDA a fused model attends through the paged kernel, and its steps replay
        # captured graphs (see worker.engine.cuda_graphs).
        self.paged = self.device.type == "cuda" and self.fused is not None
        self.use_graphs = self.paged and not config.enforce_eager
        self.max_num_rows = config.num_seqs + config.max_num_resumed_seqs
        self.max_num_batched_tokens = config.num_batched_tokens
        self.scratch_slot = 0
        self.graphs: StepGraphs | None = None
        self.lora = self._lora_store(config)

    def _lora_store(self, config: EngineConfig) -> LoraStore | None:
        """Adapters apply through the fused forward's hooks only."""
        if self.fused is None or config.max_loras == 0:
            return None
        sites = llama_sites(self.fused.layers[0])
        args = (config.max_loras, config.max_lora_rank, self.device, self.dtype)
        return LoraStore(sites, self.num_layers, *args)

    @property
    def kv_bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes the cache tensors take (on the CPU, pages are committed as blocks
        are first written)."""
        return sum(t.numel() * t.element_size() for t in (*self.key_cache, *self.value_cache))

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """The pool: ``num_blocks`` blocks per layer, plus one block of zeros that
        pads decode rows to a common length and one scratch block that padding
        tokens write to (neither is ever handed out)."""
        self.null_slot = num_blocks * self.block_size
        self.scratch_slot = self.null_slot + self.block_size
        num_slots = self.scratch_slot + self.block_size
        self.key_cache = [self._empty_pool(num_slots) for _ in range(self.num_layers)]
        self.value_cache = [self._empty_pool(num_slots) for _ in range(self.num_layers)]
        log.info(
            "KV cache: %d blocks of %d tokens, %d MiB",
            num_blocks,
            self.block_size,
            self.kv_cache_bytes >> 20,
        )
        if self.use_graphs:
            self._capture_graphs()

    def _capture_graphs(self) -> None:
        assert self.fused is not None
        started = time.perf_counter()
        self.graphs = StepGraphs(
            self.fused,
            self.key_cache,
            self.value_cache,
            self.block_size,
            self.max_num_batched_tokens,
            self.max_num_rows,
            -(-self.max_model_len // self.block_size),
            self.scratch_slot,
        )
        with torch.inference_mode():
            self.graphs.capture()
        log.info(
            "captured %d CUDA graphs (steps of 1 to %d tokens) in %.1f s",
            len(self.graphs.sizes),
            self.max_num_batched_tokens,
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
        return _available_host_bytes()

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        if self.paged:
            return self._execute_paged(out)
        step = self._prepare(out.scheduled)
        with torch.inference_mode(), sdpa_kernel(SDPA_BACKENDS):
            logits, hidden = self._forward(step)
            rows = [self._sampling_row(item) for item in out.sampled]
            token_ids, logprobs = self.sampler(logits, rows)
            pooled = self._pool(hidden, step.pool_lengths)
        return RunnerOutput(token_ids, logprobs, pooled)

    def _execute_paged(self, out: SchedulerOutput) -> RunnerOutput:
        inputs = PagedInputs.build(out.scheduled, self.block_size)
        lora = self._lora_batch(out.scheduled)  # a step with adapters runs eagerly
        with torch.inference_mode():
            hidden = None
            if lora is None and self.graphs is not None and self.graphs.can_run(inputs):
                logits = self.graphs.run(inputs)
            else:
                logits, hidden = self._forward_paged(inputs)
            rows = [self._sampling_row(item) for item in out.sampled]
            token_ids, logprobs = self.sampler(logits, rows)
            pooled = self._pool(hidden, inputs.pool_lengths)
        return RunnerOutput(token_ids, logprobs, pooled)

    def _forward_paged(self, inputs: PagedInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An eager step through the paged kernel (one with pooling rows, or too big)."""
        assert self.fused is not None
        input_ids, positions, step = inputs.to_step(
            self.key_cache, self.value_cache, self.block_size, self.device
        )
        pool_index = self._tensor(inputs.pool_index) if inputs.pool_index else None
        return self.fused(input_ids, positions, step, self._tensor(inputs.sample_index), pool_index)

    def _forward(self, step: _Step) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits of the sampling rows; final hidden states of the pooling rows."""
        if self.fused is not None:
            return self.fused(
                step.input_ids, step.positions, step.batch, step.logits_index, step.pool_index
            )
        result = self.model(
            input_ids=step.input_ids.unsqueeze(0),
            position_ids=step.positions.unsqueeze(0),
            logits_to_keep=step.logits_index,
            use_cache=False,
            tokenq_batch=step.batch,
        )
        logits: torch.Tensor = result.logits[0]
        hidden = self._last_hidden.pop()
        return logits, None if step.pool_index is None else hidden[step.pool_index]

    def _keep_hidden(self, module: Any, args: Any, output: Any) -> None:
        # The base model's (normed) last hidden state, which the causal LM's forward
        # does not return; kept for the pooling rows.
        self._last_hidden[:] = [output.last_hidden_state[0]]

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

    def _prepare(self, scheduled: list[ScheduledSeq]) -> _Step:
        inputs = _FlatInputs(self.block_size)
        for item in scheduled:
            inputs.add(item)
        batch = StepBatch(
            key_cache=self.key_cache,
            value_cache=self.value_cache,
            slot_mapping=self._tensor(inputs.slot_mapping),
            decode_groups=self._decode_groups(
                inputs.decode_index, inputs.decode_tables, inputs.decode_lens
            ),
            prefills=[self._prefill_chunk(*chunk) for chunk in inputs.prefills],
        )
        pool_index = self._tensor(inputs.pool_index) if inputs.pool_index else None
        lora = self._lora_batch(scheduled)
        return _Step(
            self._tensor(inputs.token_ids),
            self._tensor(inputs.positions),
            self._tensor(inputs.sample_index),
            pool_index,
            inputs.pool_lengths,
            batch,
            lora,
        )

    def _lora_batch(self, scheduled: list[ScheduledSeq]) -> LoraBatch | None:
        if self.lora is None or self.fused is None:
            return None
        refs = [item.seq.request.lora for item in scheduled]
        lora = self.lora.batch(refs, [item.num_tokens for item in scheduled])
        self.fused.lora = lora
        return lora

    def _block_slots(self, block_tables: list[list[int]], context_len: int) -> torch.Tensor:
        """``[rows, context_len]``: the pool slot of each position of each table."""
        num_blocks = -(-context_len // self.block_size)
        null_block = self.null_slot // self.block_size
        padded = [[*t[:num_blocks], *[null_block] * (num_blocks - len(t))] for t in block_tables]
        offsets = torch.arange(self.block_size, device=self.device)
        slots = self._tensor(padded)[:, :, None] * self.block_size + offsets
        return slots.view(len(block_tables), -1)[:, :context_len]

    def _decode_groups(
        self, token_index: list[int], block_tables: list[list[int]], context_lens: list[int]
    ) -> list[DecodeGroup]:
        """The decode rows in groups of similar context length (see
        :func:`group_by_length`), each with its context slots, padded with the zero
        slot, and the mask ``[rows, 1, 1, context]`` that hides the padding."""
        groups = []
        for rows in group_by_length(context_lens):
            lens = [context_lens[r] for r in rows]
            slots = self._block_slots([block_tables[r] for r in rows], max(lens))
            positions = torch.arange(slots.shape[1], device=self.device)
            valid = positions[None, :] < self._tensor(lens)[:, None]
            slots = slots.masked_fill(~valid, self.null_slot)
            index = self._tensor([token_index[r] for r in rows])
            if self.device.type == "cuda":
                # An additive mask, made once for every layer: with a boolean one each
                # layer's kernel converts it again.
                bias = torch.zeros(valid.shape, dtype=self.dtype, device=self.device)
                mask = bias.masked_fill_(~valid, float("-inf"))[:, None, None, :]
            else:
                mask = valid[:, None, None, :]
            groups.append(DecodeGroup(index, slots, mask))
        return groups

    def _prefill_chunk(
        self, token_start: int, token_end: int, start_pos: int, block_table: list[int]
    ) -> PrefillChunk:
        if start_pos == 0:
            return PrefillChunk(token_start, token_end, start_pos)
        context_len = start_pos + token_end - token_start
        slots = self._block_slots([block_table], context_len)[0]
        positions = torch.arange(context_len, device=self.device)
        mask = positions[None, :] <= positions[start_pos:, None]
        return PrefillChunk(token_start, token_end, start_pos, slots, mask)

    def _sampling_row(self, item: ScheduledSeq) -> SamplingRow:
        return sampling_row(item.seq, self.eos_token_ids)

    def _tensor(self, values: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)


class _FlatInputs:
    """All scheduled tokens of a step laid end to end, with where each goes in the
    cache; decode rows and prefill chunks apart."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.token_ids: list[int] = []
        self.positions: list[int] = []
        self.slot_mapping: list[int] = []
        self.decode_index: list[int] = []
        self.decode_tables: list[list[int]] = []
        self.decode_lens: list[int] = []
        self.prefills: list[tuple[int, int, int, list[int]]] = []
        self.sample_index: list[int] = []
        self.pool_index: list[int] = []
        self.pool_lengths: list[int] = []

    def add(self, item: ScheduledSeq) -> None:
        start, end = len(self.token_ids), len(self.token_ids) + item.num_tokens
        positions = range(item.start_pos, item.start_pos + item.num_tokens)
        table, size = item.block_table, self.block_size
        self.token_ids.extend(item.token_ids)
        self.positions.extend(positions)
        self.slot_mapping.extend(table[pos // size] * size + pos % size for pos in positions)
        if item.num_tokens == 1:
            self.decode_index.append(start)
            self.decode_tables.append(table)
            self.decode_lens.append(item.start_pos + 1)
        else:
            self.prefills.append((start, end, item.start_pos, table))
        if item.sample:
            self.sample_index.append(end - 1)
        if item.pool:
            self.pool_index.extend(range(start, end))
            self.pool_lengths.append(item.num_tokens)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtypes = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if name not in dtypes:
        raise ValueError(f"unknown dtype {name!r}: use one of auto, {', '.join(dtypes)}")
    return dtypes[name]


def _eos_token_ids(model: Any, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _available_host_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30
