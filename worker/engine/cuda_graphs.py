"""A step's forward on CUDA: flattened inputs for the paged kernel, and the forward
captured as CUDA graphs.

A step is every scheduled token laid end to end (decode rows and prefill chunks
alike), so its shape is only its number of tokens. :class:`StepGraphs` captures the
fused forward once per token-count bucket (1, 2, 4, 8, then steps of 16, 32, 64 and
128 up to the step budget) over static input buffers; a step copies its inputs in,
pads to its bucket and replays. Padding tokens sit at position -1 (attention reads
nothing for them) and write their keys and values to a scratch slot that no block
holds, so they change nothing. Replaying one graph replaces the thousand-odd kernel
launches of an eager forward, whose Python and launch cost, not the GPU, bounded a
step on small models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from worker.engine.attention import PagedStep
from worker.engine.outputs import ScheduledSeq

# The fused forward: input ids, positions, step, logits index -> logits, (no) pooled.
Forward = Callable[
    [torch.Tensor, torch.Tensor, PagedStep, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]
]


@dataclass
class PagedInputs:
    """A step's inputs on the host, one entry per token (rows: one per scheduled item)."""

    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slot_mapping: list[int] = field(default_factory=list)
    token_row: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    sample_index: list[int] = field(default_factory=list)
    pool_index: list[int] = field(default_factory=list)
    pool_lengths: list[int] = field(default_factory=list)

    @classmethod
    def build(cls, scheduled: list[ScheduledSeq], block_size: int) -> PagedInputs:
        inputs = cls()
        for row, item in enumerate(scheduled):
            inputs._add(row, item, block_size)
        return inputs

    def _add(self, row: int, item: ScheduledSeq, size: int) -> None:
        start = len(self.token_ids)
        end = start + item.num_tokens
        positions = range(item.start_pos, item.start_pos + item.num_tokens)
        table = item.block_table
        self.token_ids.extend(item.seq.token_ids[item.start_pos : item.start_pos + item.num_tokens])
        self.positions.extend(positions)
        self.slot_mapping.extend(table[pos // size] * size + pos % size for pos in positions)
        self.token_row.extend([row] * item.num_tokens)
        self.tables.append(table)
        if item.sample:
            self.sample_index.append(end - 1)
        if item.pool:
            self.pool_index.extend(range(start, end))
            self.pool_lengths.append(item.num_tokens)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def padded_tables(self) -> torch.Tensor:
        """Int32 ``[rows, longest table]``, zero-padded (never read past a context)."""
        width = max(len(t) for t in self.tables)
        flat: list[int] = []
        for table in self.tables:
            flat.extend(table)
            flat.extend([0] * (width - len(table)))
        return torch.tensor(flat, dtype=torch.int32).view(len(self.tables), width)

    def to_step(
        self,
        key_cache: list[torch.Tensor],
        value_cache: list[torch.Tensor],
        block_size: int,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor, PagedStep]:
        """Input ids, positions and the paged step, as fresh tensors (an eager step)."""
        step = PagedStep(
            key_cache,
            value_cache,
            _long(self.slot_mapping, device),
            self.padded_tables().to(device),
            torch.tensor(self.token_row, dtype=torch.int32, device=device),
            torch.tensor(self.positions, dtype=torch.int32, device=device),
            block_size,
        )
        return _long(self.token_ids, device), _long(self.positions, device), step


def graph_sizes(max_num_tokens: int) -> list[int]:
    """The token-count buckets a step pads to, ending at ``max_num_tokens``."""
    steps = [(16, 16, 256), (288, 32, 512), (576, 64, 1024), (1152, 128, 1 << 30)]
    sizes = [1, 2, 4, 8]
    for first, stride, last in steps:
        sizes.extend(range(first, last + 1, stride))
    return [s for s in sizes if s < max_num_tokens] + [max_num_tokens]


class StepGraphs:
    """The fused forward, captured per bucket over static buffers (see the module docs)."""

    def __init__(
        self,
        forward: Forward,
        key_cache: list[torch.Tensor],
        value_cache: list[torch.Tensor],
        block_size: int,
        max_num_tokens: int,
        max_num_rows: int,
        max_num_blocks: int,
        scratch_slot: int,
    ) -> None:
        device = key_cache[0].device
        self.forward = forward
        self.sizes = graph_sizes(max_num_tokens)
        self.max_num_rows = max_num_rows
        self.scratch_slot = scratch_slot
        self.input_ids = torch.zeros(max_num_tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_num_tokens, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_num_tokens,), scratch_slot, device=device)
        self.token_row = torch.zeros(max_num_tokens, dtype=torch.int32, device=device)
        self.token_pos = torch.full((max_num_tokens,), -1, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(
            max_num_rows, max_num_blocks, dtype=torch.int32, device=device
        )
        self.logits_index = torch.zeros(max_num_rows, dtype=torch.long, device=device)
        self.key_cache, self.value_cache, self.block_size = key_cache, value_cache, block_size
        self.logits: torch.Tensor | None = None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def capture(self) -> None:
        """Capture every bucket, largest first so that the rest reuse its memory pool."""
        pool = None
        for size in reversed(self.sizes):
            self._run(size)  # warm-up: compiles the kernels for these shapes
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._run(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def can_run(self, inputs: PagedInputs) -> bool:
        return (
            not inputs.pool_index
            and inputs.num_tokens <= self.sizes[-1]
            and len(inputs.tables) <= self.max_num_rows
            and max(len(t) for t in inputs.tables) <= self.block_tables.shape[1]
        )

    def run(self, inputs: PagedInputs) -> torch.Tensor:
        """The logits of the step's sampling rows, ``[rows that sample, vocab]``."""
        num_tokens, num_sampled = inputs.num_tokens, len(inputs.sample_index)
        size = next(s for s in self.sizes if s >= num_tokens)
        self._copy_in(self.input_ids, inputs.token_ids, torch.long)
        self._copy_in(self.positions, inputs.positions, torch.long)
        self._copy_in(self.slot_mapping, inputs.slot_mapping, torch.long)
        self._copy_in(self.token_row, inputs.token_row, torch.int32)
        self._copy_in(self.token_pos, inputs.positions, torch.int32)
        self.slot_mapping[num_tokens:size].fill_(self.scratch_slot)
        self.token_pos[num_tokens:size].fill_(-1)
        tables = inputs.padded_tables()
        self.block_tables[: tables.shape[0], : tables.shape[1]].copy_(tables, non_blocking=True)
        self._copy_in(self.logits_index, inputs.sample_index, torch.long)
        self.logits_index[num_sampled : min(size, self.max_num_rows)].zero_()
        self.graphs[size].replay()
        assert self.logits is not None
        return self.logits[:num_sampled]

    def _run(self, size: int) -> None:
        num_rows = min(size, self.max_num_rows)
        step = PagedStep(
            self.key_cache,
            self.value_cache,
            self.slot_mapping[:size],
            self.block_tables,
            self.token_row[:size],
            self.token_pos[:size],
            self.block_size,
        )
        logits, _ = self.forward(
            self.input_ids[:size], self.positions[:size], step, self.logits_index[:num_rows]
        )
        if self.logits is None:
            self.logits = torch.empty(
                (self.max_num_rows, logits.shape[-1]), dtype=logits.dtype, device=logits.device
            )
        self.logits[:num_rows].copy_(logits)

    @staticmethod
    def _copy_in(buffer: torch.Tensor, values: list[int], dtype: torch.dtype) -> None:
        if values:
            host = torch.tensor(values, dtype=dtype)
            buffer[: len(values)].copy_(host, non_blocking=True)


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
