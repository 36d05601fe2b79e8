"""State slots of a hybrid model, and how the memory budget is split. Pure Python.

A hybrid model's recurrent and convolution layers keep a fixed-size state per running
sequence (``worker.engine.models.state``): one *slot* of each such layer's state
tensors. The runner allocates ``num_slots`` slots once, beside the KV blocks and from
the same budget; this decides which sequence holds which. A sequence takes a slot when
it is admitted and gives it back when it finishes or is preempted, like its blocks
(``KVCacheManager`` asks both).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from worker.engine.errors import ModelLoadError
from worker.engine.request import Sequence

log = logging.getLogger(__name__)


class StateSlots:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # popped from the end: 0 first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, seq: Sequence) -> bool:
        return seq.state_slot is not None or bool(self._free)

    def allocate(self, seq: Sequence) -> int | None:
        """``seq``'s slot, taking a free one if it holds none; None when none is free."""
        if seq.state_slot is None:
            if not self._free:
                return None
            seq.state_slot = self._free.pop()
        return seq.state_slot

    def free(self, seq: Sequence) -> None:
        if seq.state_slot is not None:
            self._free.append(seq.state_slot)
            seq.state_slot = None


@dataclass(frozen=True)
class CacheSizes:
    num_blocks: int
    num_state_slots: int  # 0 for a model without state layers


def split_budget(
    model: str, budget_bytes: int, block_bytes: int, state_bytes: int, max_num_seqs: int
) -> CacheSizes:
    """KV blocks and state slots from one budget. A model without state layers takes
    blocks only. A hybrid takes a slot for each of the ``max_num_seqs`` sequences that
    may run at once, or as many as half the budget holds (at least one; then fewer run
    at once), and blocks from the rest: half the budget at least stays for the KV
    cache, whose need grows with every token. A budget that holds not even one slot
    and a block is refused (:class:`ModelLoadError`, naming ``model``)."""
    if state_bytes == 0:
        return CacheSizes(max(1, budget_bytes // block_bytes), 0)
    num_slots = max(1, min(max_num_seqs, budget_bytes // (2 * state_bytes)))
    num_blocks = (budget_bytes - num_slots * state_bytes) // block_bytes
    if num_blocks < 1:
        raise ModelLoadError(
            f"model {model}: one sequence's recurrent state takes {state_bytes / 2**20:.1f} MiB "
            f"and a KV block {block_bytes / 2**20:.2f} MiB, more than the KV cache budget of "
            f"{budget_bytes / 2**20:.1f} MiB; raise --kv-cache-mib"
        )
    if num_slots < max_num_seqs:
        log.warning(
            "state slots for %d sequences at once (%.1f MiB each), fewer than the batch's %d "
            "rows: a larger --kv-cache-mib runs more at once",
            num_slots,
            state_bytes / 2**20,
            max_num_seqs,
        )
    return CacheSizes(num_blocks, num_slots)
