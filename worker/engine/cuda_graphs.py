"""A step on CUDA: the paged backend, and the model's forward captured as CUDA graphs.

A step is every scheduled token laid end to end (decode rows and prefill chunks
alike), so its shape is only its number of tokens. :class:`StepGraphs` captures the
forward once per token-count bucket (1, 2, 4, 8, then steps of 16, 32, 64 and 128 up
to the step budget) over static input buffers; a step copies its inputs in, pads to
its bucket and replays. Padding tokens sit at position -1 (attention reads nothing
for them) and write their keys and values to a scratch slot that no block holds, so
they change nothing. Replaying one graph replaces the thousand-odd kernel launches
of an eager forward, whose Python and launch cost, not the GPU, bounded a step on
small models. The forward is the same one an eager step runs, for every family.

A hybrid model's state layers run a prefill chunk as a scan of its own length, which
no fixed shape holds: its graphs capture steps of one-token rows only (every bucket up
to the batch's rows), with each row's state slot and whether it starts its sequence
in static buffers; padding rows read and write the state's scratch slot. A step with a
prefill chunk runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from worker.engine.attention import PagedStep
from worker.engine.models.decoder import ForwardBatch
from worker.engine.models.state import StateCache, StateStep
from worker.engine.step_inputs import StepInputs, host_tensor, on_device, pinned

Forward = Callable[[ForwardBatch], tuple[torch.Tensor, torch.Tensor | None]]


class PagedBackend:
    """Builds each eager step's :class:`PagedStep` from its host inputs."""

    def __init__(
        self, key_cache: list[torch.Tensor], value_cache: list[torch.Tensor], block_size: int
    ) -> None:
        self.key_cache, self.value_cache = key_cache, value_cache
        self.block_size = block_size
        self.device = key_cache[0].device

    def step(self, inputs: StepInputs) -> PagedStep:
        return PagedStep(
            self.key_cache,
            self.value_cache,
            on_device(inputs.slot_mapping, torch.long, self.device),
            pinned(inputs.padded_tables(), self.device).to(self.device, non_blocking=True),
            on_device(inputs.token_row, torch.int32, self.device),
            on_device(inputs.positions, torch.int32, self.device),
            self.block_size,
        )


def graph_sizes(max_num_tokens: int) -> list[int]:
    """The token-count buckets a step pads to, ending at ``max_num_tokens``."""
    steps = [(16, 16, 256), (288, 32, 512), (576, 64, 1024), (1152, 128, 1 << 30)]
    sizes = [1, 2, 4, 8]
    for first, stride, last in steps:
        sizes.extend(range(first, last + 1, stride))
    return [s for s in sizes if s < max_num_tokens] + [max_num_tokens]


class StepGraphs:
    """The forward, captured per bucket over static buffers (see the module docs)."""

    def __init__(
        self,
        forward: Forward,
        backend: PagedBackend,
        max_num_tokens: int,
        max_num_rows: int,
        max_num_blocks: int,
        scratch_slot: int,
        state: StateCache | None = None,
    ) -> None:
        device = backend.device
        self.forward, self.backend, self.state = forward, backend, state
        if state is not None:  # one-token rows only (see the module docs)
            max_num_tokens = min(max_num_tokens, max_num_rows)
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
        scratch_state = 0 if state is None else state.scratch_slot
        self.state_slots = torch.full((max_num_rows,), scratch_state, device=device)
        self.state_fresh = torch.ones(max_num_rows, dtype=torch.bool, device=device)
        self.logits: torch.Tensor | None = None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def capture(self) -> None:
        """Capture every bucket, largest first so that the rest reuse its memory pool."""
        pool = None
        for size in reversed(self.sizes):
            self.forward_static(size)  # warm-up: compiles the kernels for these shapes
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.forward_static(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def can_run(self, inputs: StepInputs) -> bool:
        return (
            not inputs.pool_index
            and inputs.num_tokens <= self.sizes[-1]
            and len(inputs.tables) <= self.max_num_rows
            and max(len(t) for t in inputs.tables) <= self.block_tables.shape[1]
            and (self.state is None or inputs.num_tokens == len(inputs.tables))
        )

    def run(
        self, inputs: StepInputs, pending: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """The logits of the step's sampling rows, ``[rows that sample, vocab]``;
        ``pending`` puts ids still on the device at their places among the tokens."""
        size = self.load(inputs, pending)
        self.graphs[size].replay()
        assert self.logits is not None
        return self.logits[: len(inputs.sample_index)]

    def load(
        self, inputs: StepInputs, pending: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> int:
        """Copy the step into the static buffers, padded; returns its bucket."""
        num_tokens, num_sampled = inputs.num_tokens, len(inputs.sample_index)
        size = next(s for s in self.sizes if s >= num_tokens)
        self._copy_in(self.input_ids, inputs.token_ids, torch.long)
        if pending is not None:
            self.input_ids[pending[0]] = pending[1]
        self._copy_in(self.positions, inputs.positions, torch.long)
        self._copy_in(self.slot_mapping, inputs.slot_mapping, torch.long)
        self._copy_in(self.token_row, inputs.token_row, torch.int32)
        self._copy_in(self.token_pos, inputs.positions, torch.int32)
        self.slot_mapping[num_tokens:size].fill_(self.scratch_slot)
        self.token_pos[num_tokens:size].fill_(-1)
        tables = inputs.padded_tables()
        self.block_tables[: tables.shape[0], : tables.shape[1]].copy_(
            pinned(tables, self.block_tables.device), non_blocking=True
        )
        self._copy_in(self.logits_index, inputs.sample_index, torch.long)
        self.logits_index[num_sampled : min(size, self.max_num_rows)].zero_()
        if self.state is not None:  # one token per row: row i is token i
            self._load_state(inputs, size)
        return size

    def _load_state(self, inputs: StepInputs, size: int) -> None:
        """Each row's slot and whether it starts its sequence; padding rows (and rows
        given no slot, as a benchmark's made-up decode) on the scratch slot."""
        assert self.state is not None
        num_rows = len(inputs.state_slots)
        slots = [self.state.scratch_slot if s is None else s for s in inputs.state_slots]
        self._copy_in(self.state_slots, slots, torch.long)
        fresh = [pos == 0 for pos in inputs.row_start_pos]
        self.state_fresh[:num_rows].copy_(
            host_tensor(fresh, torch.bool, self.state_fresh.device), non_blocking=True
        )
        self.state_slots[num_rows:size].fill_(self.state.scratch_slot)
        self.state_fresh[num_rows:size].fill_(True)

    def forward_static(self, size: int) -> None:
        """The forward over the static buffers' first ``size`` tokens, its logits into
        the static output: what a graph captures (uncaptured, it runs on any device)."""
        num_rows = min(size, self.max_num_rows)
        step = PagedStep(
            self.backend.key_cache,
            self.backend.value_cache,
            self.slot_mapping[:size],
            self.block_tables,
            self.token_row[:size],
            self.token_pos[:size],
            self.backend.block_size,
        )
        batch = ForwardBatch(
            self.input_ids[:size], self.positions[:size], self.logits_index[:num_rows], step
        )
        if self.state is not None:
            slots, fresh = self.state_slots[:size], self.state_fresh[:size]
            batch.state = StateStep.decode_only(self.state.pools, slots, fresh)
        logits, _ = self.forward(batch)
        if self.logits is None:
            self.logits = torch.empty(
                (self.max_num_rows, logits.shape[-1]), dtype=logits.dtype, device=logits.device
            )
        self.logits[:num_rows].copy_(logits)

    @staticmethod
    def _copy_in(buffer: torch.Tensor, values: list[int], dtype: torch.dtype) -> None:
        if values:
            buffer[: len(values)].copy_(
                host_tensor(values, dtype, buffer.device), non_blocking=True
            )
