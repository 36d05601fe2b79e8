"""KV cache accounting: blocks of tokens out of a fixed budget, plus batch slots.

Pure Python. The model runner keeps the tensors; this decides who may have them.
Each running sequence holds one slot (its row in the runner's cache) and enough
blocks for the tokens it has computed or is about to compute.
"""

from __future__ import annotations

import heapq

from worker.engine.request import Sequence


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, num_slots: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_slots = num_slots
        self.num_free_blocks = num_blocks
        # The lowest free slot goes out first, so that busy rows stay packed at the
        # front of the runner's cache and a batch reads one short prefix of it.
        self._free_slots = list(range(num_slots))

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def max_num_tokens_per_seq(self) -> int:
        return self.num_blocks * self.block_size

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        num_tokens = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-num_tokens // self.block_size) - seq.num_blocks)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        if seq.slot is None and not self._free_slots:
            return False
        return self.num_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> int | None:
        """Reserve room for ``num_new_tokens`` more tokens of ``seq``.

        Returns the sequence's slot, or ``None`` when it does not fit (the caller
        picks what to preempt).
        """
        if not self.can_allocate(seq, num_new_tokens):
            return None
        num_new_blocks = self.num_blocks_needed(seq, num_new_tokens)
        self.num_free_blocks -= num_new_blocks
        seq.num_blocks += num_new_blocks
        if seq.slot is None:
            seq.slot = heapq.heappop(self._free_slots)
        return seq.slot

    def compact(self, seqs: list[Sequence]) -> list[tuple[Sequence, int, int]]:
        """Move the sequences in the highest slots down into free lower ones, so that
        the busy rows stay packed at the front however requests finish; a decode step
        then reads only as many rows as it has requests. Returns each moved sequence
        with the slot it left and the one it took (its keys and values must follow)."""
        moves: list[tuple[Sequence, int, int]] = []
        for seq in sorted(seqs, key=lambda s: -1 if s.slot is None else s.slot, reverse=True):
            if seq.slot is None or not self._free_slots or self._free_slots[0] > seq.slot:
                break
            old = seq.slot
            seq.slot = heapq.heapreplace(self._free_slots, old)
            moves.append((seq, old, seq.slot))
        return moves

    def free(self, seq: Sequence) -> None:
        self.num_free_blocks += seq.num_blocks
        seq.num_blocks = 0
        if seq.slot is not None:
            heapq.heappush(self._free_slots, seq.slot)
            seq.slot = None

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0
