"""A step's inputs, built on the host: every scheduled token laid end to end.

One builder for every device and family: the tokens and positions, where each
token's key and value go in the cache (``slot_mapping``), each row's block table
and span, which tokens sample and which pool. Each device's attention backend turns
it into its own tensors (``worker.engine.cpu_attention``, ``worker.engine.attention``);
nothing here touches the device, so the host can build step N+1 while step N runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from worker.engine.outputs import ScheduledSeq
from worker.engine.request import LoraRef

# Whether a step carries each token's rope length, and of what (models.rotary).
RopeLens = Literal["prompt", "sequence"] | None


@dataclass
class StepInputs:
    """A step's inputs on the host: per token, and per row (one per scheduled item)."""

    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slot_mapping: list[int] = field(default_factory=list)
    token_row: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    row_starts: list[int] = field(default_factory=list)  # each row's first token in the step
    row_start_pos: list[int] = field(default_factory=list)
    row_num_tokens: list[int] = field(default_factory=list)
    loras: list[LoraRef | None] = field(default_factory=list)
    sample_index: list[int] = field(default_factory=list)
    pool_index: list[int] = field(default_factory=list)
    pool_lengths: list[int] = field(default_factory=list)
    # Each token's rope length, for rope kinds that change with it (models.rotary).
    rope_lens: list[int] | None = None

    @classmethod
    def build(
        cls, scheduled: list[ScheduledSeq], block_size: int, rope_lens: RopeLens = None
    ) -> StepInputs:
        inputs = cls(rope_lens=None if rope_lens is None else [])
        for item in scheduled:
            inputs.add(item, block_size, rope_lens)
        return inputs

    def add(self, item: ScheduledSeq, size: int, rope_lens: RopeLens = None) -> None:
        start, row = len(self.token_ids), len(self.tables)
        end = start + item.num_tokens
        positions = range(item.start_pos, item.start_pos + item.num_tokens)
        table = item.block_table
        self.token_ids.extend(item.seq.token_ids[item.start_pos : item.start_pos + item.num_tokens])
        self.positions.extend(positions)
        self.slot_mapping.extend(table[pos // size] * size + pos % size for pos in positions)
        self.token_row.extend([row] * item.num_tokens)
        self.tables.append(table)
        self.row_starts.append(start)
        self.row_start_pos.append(item.start_pos)
        self.row_num_tokens.append(item.num_tokens)
        self.loras.append(item.seq.request.lora)
        if self.rope_lens is not None:
            # models.rotary: the prompt's length while prefilling, the token's own after
            # (or, for whole-sequence rotaries, the sequence's length now).
            least = item.seq.num_tokens if rope_lens == "sequence" else item.seq.num_prompt_tokens
            self.rope_lens.extend(max(least, pos + 1) for pos in positions)
        if item.sample:
            self.sample_index.append(end - 1)
        if item.pool:
            self.pool_index.extend(range(start, end))
            self.pool_lengths.append(item.num_tokens)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def padded_tables(self, pad: int = 0) -> torch.Tensor:
        """Int32 ``[rows, longest table]``, padded with block ``pad`` (never read)."""
        width = max(len(t) for t in self.tables)
        flat: list[int] = []
        for table in self.tables:
            flat.extend(table)
            flat.extend([pad] * (width - len(table)))
        return torch.tensor(flat, dtype=torch.int32).view(len(self.tables), width)
