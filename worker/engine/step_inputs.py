"""A step's inputs, built on the host: every scheduled token laid end to end.

One builder for every device and family: the tokens and positions, where each
token's key and value go in the cache (``slot_mapping``), each row's block table,
state slot (hybrid models, ``worker.engine.models.state``) and span, which tokens
sample and which pool. Each device's attention backend turns
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


def on_device(values: object, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a tensor on ``device``, copied without making the host wait."""
    return host_tensor(values, dtype, device).to(device, non_blocking=True)


def host_tensor(values: object, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` on the host, ready for a copy to ``device`` that the host need not wait
    for: in pinned memory for CUDA (whose caching allocator keeps the block until the copy
    is done); ``torch.tensor(..., device=cuda)`` waits for the whole stream instead, and a
    copy from pageable memory may too."""
    return torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")


def pinned(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor made ready for a copy to ``device`` as ``host_tensor``'s are."""
    return tensor.pin_memory() if device.type == "cuda" else tensor


@dataclass
class StepInputs:
    """A step's inputs on the host: per token, and per row (one per scheduled item)."""

    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slot_mapping: list[int] = field(default_factory=list)
    token_row: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    state_slots: list[int | None] = field(default_factory=list)
    row_starts: list[int] = field(default_factory=list)  # each row's first token in the step
    row_start_pos: list[int] = field(default_factory=list)
    row_num_tokens: list[int] = field(default_factory=list)
    loras: list[LoraRef | None] = field(default_factory=list)
    sample_index: list[int] = field(default_factory=list)
    pool_index: list[int] = field(default_factory=list)
    pool_lengths: list[int] = field(default_factory=list)
    # Prompt logprobs (``worker.engine.prompt_logprobs``): the tokens whose logits score
    # the prompt token after them, those tokens, and per row that scores (in order) its
    # number of scored tokens and of top alternatives.
    prompt_index: list[int] = field(default_factory=list)
    prompt_targets: list[int] = field(default_factory=list)
    prompt_spans: list[tuple[int, int]] = field(default_factory=list)
    # Each token's rope length, for rope kinds that change with it (models.rotary).
    rope_lens: list[int] | None = None
    # Tokens still on the device (``PENDING`` in ``token_ids``): where each sits in the
    # step, and its row in the previous step's sampled ids (``worker.engine.overlap``).
    pending_index: list[int] = field(default_factory=list)
    pending_rows: list[int] = field(default_factory=list)

    @classmethod
    def build(
        cls, scheduled: list[ScheduledSeq], block_size: int, rope_lens: RopeLens = None
    ) -> StepInputs:
        inputs = cls(rope_lens=None if rope_lens is None else [])
        decodes: list[ScheduledSeq] = []  # a run of one-token rows, added together
        for item in scheduled:
            if (
                item.num_tokens == 1
                and rope_lens is None
                and not item.pool
                and not item.num_prompt_scores
            ):
                decodes.append(item)
                continue
            inputs._add_decodes(decodes, block_size)
            decodes = []
            inputs.add(item, block_size, rope_lens)
        inputs._add_decodes(decodes, block_size)
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
        self.tables.append(list(table))  # the sequence's own may change while the step runs
        self.state_slots.append(item.state_slot)
        self.row_starts.append(start)
        self.row_start_pos.append(item.start_pos)
        self.row_num_tokens.append(item.num_tokens)
        self.loras.append(item.seq.request.lora)
        if self.rope_lens is not None:
            # models.rotary: the prompt's length while prefilling, the token's own after
            # (or, for whole-sequence rotaries, the sequence's length now).
            least = item.seq.num_tokens if rope_lens == "sequence" else item.seq.num_prompt_tokens
            self.rope_lens.extend(max(least, pos + 1) for pos in positions)
        if item.seq.num_pending_tokens and item.start_pos + item.num_tokens == item.seq.num_tokens:
            self.pending_index.append(end - 1)
            self.pending_rows.append(item.seq.pending_row)
        if item.sample:
            self.sample_index.append(end - 1)
        if item.pool:
            self.pool_index.extend(range(start, end))
            self.pool_lengths.append(item.num_tokens)
        self._add_prompt_scores(item, start)

    def _add_prompt_scores(self, item: ScheduledSeq, start: int) -> None:
        num_scores = item.num_prompt_scores
        if not num_scores:
            return
        first = item.start_pos + 1  # the first prompt token this row's logits score
        self.prompt_index.extend(range(start, start + num_scores))
        self.prompt_targets.extend(item.seq.token_ids[first : first + num_scores])
        self.prompt_spans.append((num_scores, item.seq.sampling.prompt_logprobs or 0))

    def _add_decodes(self, items: list[ScheduledSeq], size: int) -> None:
        """``add`` for a run of one-token rows, the most common by far: a column at a
        time rather than a row at a time, as there can be hundreds a step."""
        if not items:
            return
        start, first_row, num_rows = len(self.token_ids), len(self.tables), len(items)
        seqs = [item.seq for item in items]
        positions = [item.start_pos for item in items]
        tables = [seq.block_table for seq in seqs]
        self.token_ids += [seq.token_ids[pos] for seq, pos in zip(seqs, positions, strict=True)]
        self.positions += positions
        self.slot_mapping += [
            table[pos // size] * size + pos % size
            for table, pos in zip(tables, positions, strict=True)
        ]
        self.token_row += range(first_row, first_row + num_rows)
        self.tables += [table.copy() for table in tables]  # the sequences' own may change
        self.state_slots += [seq.state_slot for seq in seqs]
        self.row_starts += range(start, start + num_rows)
        self.row_start_pos += positions
        self.row_num_tokens += [1] * num_rows
        self.loras += [seq.request.lora for seq in seqs]
        for at, (seq, pos) in enumerate(zip(seqs, positions, strict=True)):
            if seq.num_pending_tokens and pos + 1 == len(seq.token_ids):
                self.pending_index.append(start + at)
                self.pending_rows.append(seq.pending_row)
        self.sample_index += [start + at for at, item in enumerate(items) if item.sample]

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
