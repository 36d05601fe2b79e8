"""Which tokens of which requests run each step. Pure Python: no torch, no Redis.

Each step spends a token budget: running requests first, in priority order (one
token each while decoding, a chunk while prefilling), then waiting requests in
priority order while the batch, the budget and the KV cache's blocks last. A
waiting request starts after the longest prefix of it that the KV cache already
holds (prefix caching). When the KV cache cannot hold a running request's next
tokens, the least urgent running request (by ``Sequence.__lt__``) is preempted: its
blocks are freed and it is recomputed later from its tokens (mostly from the cache,
where its blocks were not reused meanwhile), so it resumes without losing or
repeating one. A waiting request more urgent than the least urgent running one
preempts it when the batch is full. A request resumed after its worker died (its
client is mid-answer) may also take one of a few rows kept for such requests, and new
work never preempts it. Requests with LoRA adapters run with at most ``max_loras``
adapters among the running ones; a request that would bring one more waits, and later
requests with adapters wait behind it, so that the adapters in use drain. A model whose
rotary switches at a length and recomputes what came before (Phi-3's longrope, as
transformers generates it) has a sequence reaching ``recompute_at`` tokens recomputed
whole, as a preemption does.

The engine calls :meth:`Scheduler.advance` as it launches a step (each sampled
sequence gains a ``PENDING`` token) and :meth:`Scheduler.update_from_output` when it
reads the step's tokens: at once when it runs synchronously, one step later with
asynchronous scheduling, where the device feeds each pending token to the step
launched meanwhile. A running sequence whose pending token must be read on the host
first (``Sequence.waits_for_token``) sits that step out, and a preempted one waits for
its pending token before it is admitted again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from operator import attrgetter

from shared.models import FinishReason
from shared.priority import MAX_PRIORITY
from worker.engine.kv_cache import KVCacheManager
from worker.engine.outputs import RunnerOutput, ScheduledSeq, SchedulerOutput
from worker.engine.request import PENDING, LoraRef, SeqStatus, Sequence

# ``Sequence``'s order read without a Python call per sequence: the waiting line is
# sorted every step and can be thousands long.
_ORDER = attrgetter("sort_key")


class Scheduler:
    def __init__(
        self,
        kv_cache: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        prefill_chunk_tokens: int | None = None,
        aging_interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        ttft_priority: int | None = None,
        max_num_resumed_seqs: int = 0,
        max_loras: int | None = None,
        recompute_at: int | None = None,
    ) -> None:
        self.kv_cache = kv_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_resumed_seqs = max_num_resumed_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.aging_interval_s = aging_interval_s
        self.clock = clock
        self.ttft_priority = ttft_priority
        self.max_loras = max_loras
        self.recompute_at = recompute_at
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self._waiting_since: dict[int, float] = {}
        self._num_resumed_or_adapted_waiting = 0  # of the waiting line
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self._make_waiting(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def get(self, request_id: str) -> Sequence | None:
        for seq in (*self.running, *self.waiting):
            if seq.request_id == request_id:
                return seq
        return None

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._age_waiting()
        self.waiting.sort(key=_ORDER)
        self.running.sort(key=_ORDER)
        self._preempt_for_waiting(out)
        if self._urgent_waiting():
            # The urgent requests' prefills run in a short step of their own, so
            # their first token does not wait for a whole batch of decodes.
            self._schedule_waiting(out, self.max_num_batched_tokens, self.ttft_priority)
            if out.scheduled:
                return out
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        self._schedule_waiting(out, budget)
        return out

    def _urgent_waiting(self) -> bool:
        return (
            self.ttft_priority is not None
            and bool(self.running)
            and bool(self.waiting)
            and self.waiting[0].priority >= self.ttft_priority
        )

    def advance(self, out: SchedulerOutput) -> list[int]:
        """A step launched: advance the computed counts and give each sampled sequence a
        pending token, row ``i`` of the step's samples. Returns where each pending token
        sits in its sequence, for :meth:`update_from_output`."""
        for item in out.scheduled:
            item.seq.num_computed_tokens = item.start_pos + item.num_tokens
        token_index = []
        for row, item in enumerate(out.sampled):
            seq = item.seq
            token_index.append(len(seq.token_ids))
            seq.token_ids.append(PENDING)
            seq.num_pending_tokens += 1
            seq.pending_row = row
        return token_index

    def update_from_output(
        self, out: SchedulerOutput, runner_out: RunnerOutput, token_index: list[int]
    ) -> None:
        """A step's tokens read: each pending token (at ``token_index``, from
        :meth:`advance`) takes its sampled id, a sequence finished since drops its own,
        and the blocks the step filled are cached (the one place that caches them)."""
        for item, index, token_id in zip(
            out.sampled, token_index, runner_out.token_ids, strict=True
        ):
            seq = item.seq
            if seq.status is not SeqStatus.FINISHED:
                seq.token_ids[index] = token_id
                seq.num_pending_tokens -= 1
        for item in out.scheduled:
            if item.seq.status is SeqStatus.RUNNING:
                self.kv_cache.cache_full_blocks(item.seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Take ``seq`` out of the batch (or the waiting line) and free its cache."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING:
            self._leave_waiting(seq)
        self.kv_cache.free(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        for seq in list(self.running):
            if budget == 0 or seq.status is not SeqStatus.RUNNING:
                break
            if seq.waits_for_token:
                continue
            if seq.num_computed_tokens == self.recompute_at == seq.num_tokens - 1:
                self._preempt(seq, out)  # its next token crosses the switch: all of it again
                continue
            num_tokens = self._reserve(seq, budget, out)
            if num_tokens:
                out.scheduled.append(self._item(seq, num_tokens))
                budget -= num_tokens
        return budget

    def _reserve(self, seq: Sequence, budget: int, out: SchedulerOutput) -> int:
        """Allocate this step's chunk of a running ``seq``, preempting less urgent
        requests (or ``seq`` itself, when it is the least urgent) until it fits."""
        if seq.num_uncomputed_tokens == 1 and self._has_room_for_one(seq):
            return 1  # a decode within its last block: nothing to allocate
        num_tokens = self._chunk_size(seq, budget)
        while self.kv_cache.allocate(seq, num_tokens) is None:
            num_fitting = self._num_fitting_tokens(seq)
            if 0 < num_fitting < num_tokens:
                # A prefill chunk shrinks to what fits before anyone is preempted.
                num_tokens = num_fitting
                continue
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is seq:
                return 0
        return num_tokens

    def _has_room_for_one(self, seq: Sequence) -> bool:
        """Whether ``seq``'s blocks (and state slot) already hold its next token."""
        if self.kv_cache.state_slots is not None and seq.state_slot is None:
            return False
        return seq.num_computed_tokens < len(seq.block_table) * self.kv_cache.block_size

    def has_row_for(self, seq: Sequence) -> bool:
        """Whether the batch has a row ``seq`` may take. Requests resumed mid-answer
        after their worker died may also take the ``max_num_resumed_seqs`` rows kept
        for them; new work counts only the rows new work holds."""
        if len(self.running) >= self.max_num_seqs + self.max_num_resumed_seqs:
            return False
        return seq.request.resumed or self._has_row_for_new_work()

    def _has_row_for_new_work(self) -> bool:
        if len(self.running) < self.max_num_seqs:
            return True
        return sum(not s.request.resumed for s in self.running) < self.max_num_seqs

    def _next_admissible(self) -> Sequence | None:
        """The first waiting request the batch has a row for, in priority order (the
        rows are counted once: the waiting line can be thousands long), whose adapter
        fits too. Once one is held back for its adapter, later requests with adapters
        wait behind it (so the adapters in use drain); base ones still join."""
        if len(self.running) >= self.max_num_seqs + self.max_num_resumed_seqs:
            return None
        new_work = self._has_row_for_new_work()
        in_use: set[LoraRef] | None = None
        held_back = False
        # With no row for new work, only resumed requests can join, and only requests
        # with adapters can hold them back: the others need not be looked at.
        candidates = self.waiting if new_work else self._resumed_or_adapted()
        for seq in candidates:
            if seq.num_pending_tokens:
                continue  # preempted while its last token was in flight
            lora = seq.request.lora
            if lora is not None:
                in_use = self._adapters_in_use() if in_use is None else in_use
                if held_back or not self._adapter_fits(lora, in_use):
                    held_back = True
                    continue
            if new_work or seq.request.resumed:
                return seq
        return None

    def _resumed_or_adapted(self) -> list[Sequence]:
        if not self._num_resumed_or_adapted_waiting:
            return []  # the usual case: no need to scan a waiting line thousands long
        return [s for s in self.waiting if _resumed_or_adapted(s)]

    def _adapters_in_use(self) -> set[LoraRef]:
        return {s.request.lora for s in self.running if s.request.lora is not None}

    def _adapter_fits(self, lora: LoraRef, in_use: set[LoraRef]) -> bool:
        return lora in in_use or self.max_loras is None or len(in_use) < self.max_loras

    def _victim_for(self, head: Sequence) -> Sequence | None:
        """The least urgent running request whose row ``head`` could take: new work
        never displaces a resumed request (its client is mid-answer, in a kept row)."""
        rows = [s for s in self.running if head.request.resumed or not s.request.resumed]
        return rows[-1] if rows else None

    def _schedule_waiting(
        self, out: SchedulerOutput, budget: int, min_priority: int | None = None
    ) -> None:
        while budget > 0 and (seq := self._next_admissible()) is not None:
            if seq.priority < (min_priority or 0):
                return
            cached = self.kv_cache.cached_prefix(seq)
            if not self._fits_whole(seq, cached):
                return
            self._leave_waiting(seq)
            budget -= self._admit(seq, cached, budget, out)

    def _admit(self, seq: Sequence, cached: list[int], budget: int, out: SchedulerOutput) -> int:
        """Start ``seq`` after its ``cached`` prefix; returns the tokens it computes."""
        num_cached_tokens = len(cached) * self.kv_cache.block_size
        num_tokens = self._chunk_size(seq, budget, num_cached_tokens)
        if self.kv_cache.allocate(seq, num_tokens, cached) is None:
            raise RuntimeError(f"request {seq.request_id} was admitted without room")
        seq.num_computed_tokens = num_cached_tokens
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        out.scheduled.append(self._item(seq, num_tokens))
        return num_tokens

    def _preempt_for_waiting(self, out: SchedulerOutput) -> None:
        while self.waiting and self.running:
            head = self.waiting[0]
            victim = self._victim_for(head)
            if victim is None or head.priority <= victim.priority:
                return
            if self.has_row_for(head) and self._fits_whole(head, self.kv_cache.cached_prefix(head)):
                return
            self._preempt(victim, out)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.kv_cache.free(seq)
        seq.num_computed_tokens = 0
        self._make_waiting(seq)
        self.waiting.sort(key=_ORDER)
        out.preempted.append(seq)
        self.num_preemptions += 1

    def _make_waiting(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)
        self._waiting_since[seq.seq_no] = self.clock()
        self._num_resumed_or_adapted_waiting += _resumed_or_adapted(seq)

    def _leave_waiting(self, seq: Sequence) -> None:
        self.waiting.remove(seq)
        self._waiting_since.pop(seq.seq_no, None)
        self._num_resumed_or_adapted_waiting -= _resumed_or_adapted(seq)

    def _fits_whole(self, seq: Sequence, cached: list[int]) -> bool:
        """Room for all of a waiting request's tokens past its ``cached`` prefix and
        its next one, so that admitting it does not straight away force a preemption."""
        num_new_tokens = seq.num_uncomputed_tokens - len(cached) * self.kv_cache.block_size
        return self.kv_cache.can_allocate(seq, num_new_tokens + 1, cached)

    def _num_fitting_tokens(self, seq: Sequence) -> int:
        num_blocks = len(seq.block_table) + self.kv_cache.num_free_blocks
        return num_blocks * self.kv_cache.block_size - seq.num_computed_tokens

    def _chunk_size(self, seq: Sequence, budget: int, num_cached_tokens: int = 0) -> int:
        limit = self.prefill_chunk_tokens or budget
        return min(seq.num_uncomputed_tokens - num_cached_tokens, budget, limit)

    @staticmethod
    def _item(seq: Sequence, num_tokens: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        sample = start + num_tokens == seq.num_tokens and not seq.request.embed
        return ScheduledSeq(seq, start, num_tokens, sample)

    def _age_waiting(self) -> None:
        """Aging: a waiting request gains a priority point per ``aging_interval_s``."""
        if self.aging_interval_s is None:
            return
        now = self.clock()
        for seq in self.waiting:
            waited_s = now - self._waiting_since.get(seq.seq_no, now)
            earned = int(waited_s / self.aging_interval_s)
            boost = max(seq.boost, min(earned, MAX_PRIORITY - seq.request.priority))
            if boost != seq.boost:
                seq.raise_boost(boost)


def _resumed_or_adapted(seq: Sequence) -> bool:
    return seq.request.resumed or seq.request.lora is not None
