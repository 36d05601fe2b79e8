"""Runs a step on the device: the only part of the engine that holds tensors.

It executes what the scheduler decided, never decides anything itself: builds
the flattened inputs, runs the model's forward (logits only for the rows that
sample), and samples.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from worker.engine.attention import ATTN_IMPLEMENTATION, PrefillChunk, StepBatch
from worker.engine.config import EngineConfig
from worker.engine.fused_llama import FusedLlama
from worker.engine.outputs import KVCopy, RunnerOutput, ScheduledSeq, SchedulerOutput
from worker.engine.sampler import Sampler, SamplingRow, sampling_row

log = logging.getLogger(__name__)

CACHE_GROWTH_TOKENS = 256
# cuDNN's attention is left out: it builds a plan for each new shape, milliseconds of
# CPU time, and a step's context lengths are new every step.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class ModelRunner:
    def __init__(self, config: EngineConfig, model_path: str | Path) -> None:
        self.device = _pick_device(config.device)
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
        self.num_slots = config.max_num_seqs
        self.sampler = Sampler(self.device)
        self.key_cache: list[torch.Tensor] = []
        self.value_cache: list[torch.Tensor] = []
        self.cache_capacity = 0

    @property
    def kv_bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes the cache tensors take now (they grow with the longest sequence)."""
        return sum(t.numel() * t.element_size() for t in (*self.key_cache, *self.value_cache))

    def num_free_bytes(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free)
        return _available_host_bytes()

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        self._ensure_capacity(max(s.start_pos + s.num_tokens for s in out.scheduled))
        self._copy_prefixes(out.kv_copies)
        input_ids, positions, logits_index, batch = self._prepare(out.scheduled)
        with torch.inference_mode(), sdpa_kernel(SDPA_BACKENDS):
            logits = self._forward(input_ids, positions, logits_index, batch)
            rows = [self._sampling_row(item) for item in out.sampled]
            token_ids, logprobs = self.sampler(logits, rows)
        return RunnerOutput(token_ids, logprobs)

    def _forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        logits_index: torch.Tensor,
        batch: StepBatch,
    ) -> torch.Tensor:
        if self.fused is not None:
            return self.fused(input_ids, positions, batch, logits_index)
        result = self.model(
            input_ids=input_ids.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            logits_to_keep=logits_index,
            use_cache=False,
            tokenq_batch=batch,
        )
        logits: torch.Tensor = result.logits[0]
        return logits

    def _prepare(
        self, scheduled: list[ScheduledSeq]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, StepBatch]:
        inputs = _FlatInputs()
        for item in scheduled:
            inputs.add(item)
        batch = StepBatch(
            key_cache=self.key_cache,
            value_cache=self.value_cache,
            write_slots=self._tensor(inputs.slots),
            write_positions=self._tensor(inputs.positions),
            decode_token_index=self._tensor(inputs.decode_index),
            decode_slots=self._tensor(inputs.decode_slots),
            decode_mask=self._decode_mask(inputs.decode_slots, inputs.decode_lens),
            prefills=inputs.prefills,
        )
        return (
            self._tensor(inputs.token_ids),
            self._tensor(inputs.positions),
            self._tensor(inputs.sample_index),
            batch,
        )

    def _decode_mask(self, slots: list[int], lens: list[int]) -> torch.Tensor | None:
        """``[rows, 1, 1, context]``: each decode row sees its own context; rows of
        slots not decoding this step see one position, so that no row is all masked."""
        if not slots:
            return None
        row_lens = [1] * (max(slots) + 1)
        for slot, length in zip(slots, lens, strict=True):
            row_lens[slot] = length
        positions = torch.arange(max(lens), device=self.device)
        mask = positions[None, :] < self._tensor(row_lens)[:, None]
        if self.device.type == "cuda":
            # An additive mask, made once for every layer: with a boolean one each
            # layer's kernel converts it again.
            bias = torch.zeros(mask.shape, dtype=self.dtype, device=self.device)
            return bias.masked_fill_(~mask, float("-inf"))[:, None, None, :]
        return mask[:, None, None, :]

    def _sampling_row(self, item: ScheduledSeq) -> SamplingRow:
        return sampling_row(item.seq, self.eos_token_ids)

    def _copy_prefixes(self, copies: list[KVCopy]) -> None:
        for copy in copies:
            for cache in (*self.key_cache, *self.value_cache):
                cache[copy.dst_slot, :, : copy.num_tokens] = cache[
                    copy.src_slot, :, : copy.num_tokens
                ]

    def _ensure_capacity(self, num_tokens: int) -> None:
        if num_tokens <= self.cache_capacity:
            return
        capacity = max(num_tokens, 2 * self.cache_capacity, CACHE_GROWTH_TOKENS)
        capacity = min(
            -(-capacity // CACHE_GROWTH_TOKENS) * CACHE_GROWTH_TOKENS, self.max_model_len
        )
        shape = (self.num_slots, self.num_kv_heads, capacity, self.head_dim)
        self.key_cache = self._grow(self.key_cache, shape)
        self.value_cache = self._grow(self.value_cache, shape)
        self.cache_capacity = capacity
        log.info("KV cache rows grown to %d tokens (%d MiB)", capacity, self.kv_cache_bytes >> 20)

    def _grow(self, old: list[torch.Tensor], shape: tuple[int, ...]) -> list[torch.Tensor]:
        """Per-layer tensors of ``shape``, keeping what ``old`` held."""
        layers = [
            torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)
        ]
        for new, held in zip(layers, old, strict=False):
            new[:, :, : held.shape[2]] = held
        return layers

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)


class _FlatInputs:
    """All scheduled tokens of a step laid end to end."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.positions: list[int] = []
        self.slots: list[int] = []
        self.decode_index: list[int] = []
        self.decode_slots: list[int] = []
        self.decode_lens: list[int] = []
        self.prefills: list[PrefillChunk] = []
        self.sample_index: list[int] = []

    def add(self, item: ScheduledSeq) -> None:
        start, end = len(self.token_ids), len(self.token_ids) + item.num_tokens
        self.token_ids.extend(item.token_ids)
        self.positions.extend(range(item.start_pos, item.start_pos + item.num_tokens))
        self.slots.extend([item.slot] * item.num_tokens)
        if item.num_tokens == 1:
            self.decode_index.append(start)
            self.decode_slots.append(item.slot)
            self.decode_lens.append(item.start_pos + 1)
        else:
            self.prefills.append(PrefillChunk(start, end, item.slot, item.start_pos))
        if item.sample:
            self.sample_index.append(end - 1)


def _pick_device(name: str) -> torch.device:
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
