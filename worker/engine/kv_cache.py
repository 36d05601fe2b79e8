"""The paged KV cache's block manager: which sequence holds which blocks. Pure Python.

The model runner keeps one pool of ``num_blocks`` fixed-size blocks per layer,
allocated once; this decides who may use them. Each sequence holds a block table,
the pool blocks its tokens' keys and values live in, in order.

Automatic prefix caching: a full block, once computed, is known by a digest of its
tokens and of every token before it (the digest of the block before it), so a new
request that starts with the same tokens takes those blocks instead of computing
them again. A block is shared by reference count and never written while shared:
only full blocks are shared, and a sequence writes only past its computed tokens,
into blocks of its own. A freed block keeps its contents and digest, so that a later
request still hits it, until the pool needs it back: the least recently freed is
reused first, and a sequence frees its blocks last-first, so that a prefix's first
blocks outlive its tail.

A request's prefix fingerprints (``EngineRequest.prefix_cuts``) are tracked against the
blocks of their cuts: a fingerprint is warm while every full block up to its cut is
cached, which the worker publishes so that claims prefer requests it holds warm.

A hybrid model's sequence also needs a state slot (``worker.engine.state_slots``): with
``num_state_slots``, a sequence fits only where its blocks and a slot are both free, it
takes its slot with its first blocks, and gives both back when freed; such a model
serves without prefix caching.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence as Seq

from worker.engine.request import Sequence
from worker.engine.state_slots import StateSlots


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        num_state_slots: int = 0,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        # A cached block holds keys and values, not the state after it: a hybrid's
        # sequence is always computed from its first token.
        self.enable_prefix_caching = enable_prefix_caching and not num_state_slots
        self.state_slots = StateSlots(num_state_slots) if num_state_slots else None
        self.ref_counts = [0] * num_blocks
        self._block_hashes: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}
        # Free blocks, next to reuse first: blocks with no cached contents at the
        # front, then cached ones from least to most recently freed.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        # Fingerprint -> the digests of the full blocks up to its cut, least recently
        # used first, at most MAX_TRACKED_FINGERPRINTS.
        self._fingerprints: OrderedDict[str, tuple[bytes, ...]] = OrderedDict()

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds, cached contents or not."""
        return len(self._free)

    @property
    def max_num_tokens_per_seq(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def usage(self) -> float:
        """The share of the pool that running sequences hold, 0..1."""
        return (self.num_blocks - self.num_free_blocks) / self.num_blocks

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks that hold ``seq``'s first tokens, in order. One token is
        always left out, so that computing it yields the logits to sample from. An
        embed request takes none: pooling needs every token's hidden state; nor does
        one asking for prompt logprobs: they need every prompt position's logits."""
        request = seq.request
        if not self.enable_prefix_caching or seq.block_table or request.embed:
            return []
        if request.sampling.prompt_logprobs is not None:
            return []
        blocks: list[int] = []
        for digest in self._digests(seq, (seq.num_tokens - 1) // self.block_size):
            block_id = self._cached.get(digest)
            if block_id is None:
                break
            blocks.append(block_id)
        return blocks

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int, cached: Seq[int] = ()) -> int:
        """Free blocks it takes for ``seq`` to compute ``num_new_tokens`` more
        tokens after its computed ones and the ``cached`` prefix it takes."""
        num_tokens = seq.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        num_fresh = -(-num_tokens // self.block_size) - len(seq.block_table) - len(cached)
        num_cached_free = sum(1 for block_id in cached if self.ref_counts[block_id] == 0)
        return max(0, num_fresh) + num_cached_free

    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached: Seq[int] = ()) -> bool:
        if self.state_slots is not None and not self.state_slots.can_allocate(seq):
            return False
        return self.num_blocks_needed(seq, num_new_tokens, cached) <= self.num_free_blocks

    def allocate(
        self, seq: Sequence, num_new_tokens: int, cached: Seq[int] = ()
    ) -> list[int] | None:
        """Extend ``seq``'s block table to hold ``num_new_tokens`` more tokens, taking
        the ``cached`` prefix first (from :meth:`cached_prefix`, for a sequence that
        holds nothing yet; the caller counts those tokens as computed).

        Returns the block table, or ``None`` when it does not fit (the caller picks
        what to preempt).
        """
        if not self.can_allocate(seq, num_new_tokens, cached):
            return None
        if self.state_slots is not None:
            self.state_slots.allocate(seq)
        if not seq.block_table and self.enable_prefix_caching:
            self.num_queried_tokens += seq.num_tokens
            self.num_hit_tokens += len(cached) * self.block_size
            seq.num_prefix_queried_tokens += seq.num_tokens
            seq.num_prefix_hit_tokens += len(cached) * self.block_size
        for block_id in cached:
            if self.ref_counts[block_id] == 0:
                del self._free[block_id]
            self.ref_counts[block_id] += 1
            seq.block_table.append(block_id)
        seq.num_cached_blocks = max(seq.num_cached_blocks, len(cached))
        num_tokens = seq.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        while len(seq.block_table) * self.block_size < num_tokens:
            seq.block_table.append(self._take_free_block())
        return seq.block_table

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Make ``seq``'s full, computed blocks findable by later requests. An embed
        request's are not: nothing reuses them, and unhashed freed blocks go first."""
        if not self.enable_prefix_caching or seq.request.embed:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_cached_blocks:
            return
        self._note_cuts(seq, seq.num_cached_blocks, num_full)
        digests = self._digests(seq, num_full)
        for index in range(seq.num_cached_blocks, num_full):
            block_id, digest = seq.block_table[index], digests[index]
            # The same tokens computed twice (two requests admitted before either
            # finished the block): the first copy stays the cached one.
            if digest not in self._cached:
                self._cached[digest] = block_id
                self._block_hashes[block_id] = digest
        seq.num_cached_blocks = num_full

    def _note_cuts(self, seq: Sequence, num_before: int, num_full: int) -> None:
        """Track the fingerprints whose cut blocks ``seq`` now has all cached (hits
        included), the newest last. Called with the blocks cached before and now."""
        for fingerprint, num_tokens in seq.request.prefix_cuts:
            num_blocks = num_tokens // self.block_size
            if num_blocks == 0 or num_blocks > num_full:
                continue
            if num_blocks <= num_before and fingerprint in self._fingerprints:
                self._fingerprints.move_to_end(fingerprint)
                continue
            self._fingerprints[fingerprint] = tuple(self._digests(seq, num_blocks))
            self._fingerprints.move_to_end(fingerprint)
            if len(self._fingerprints) > MAX_TRACKED_FINGERPRINTS:
                self._fingerprints.popitem(last=False)

    def warm_fingerprints(self, limit: int) -> list[str]:
        """Up to ``limit`` fingerprints whose blocks are all still cached, most recently
        used first. Read from the heartbeat's thread while the engine's runs: it copies
        the table first (one step under the GIL) and changes nothing."""
        tracked = list(self._fingerprints.items())
        warm: list[str] = []
        for fingerprint, digests in reversed(tracked):
            if all(d in self._cached for d in digests):
                warm.append(fingerprint)
                if len(warm) >= limit:
                    break
        return warm

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks (and state slot); cached contents stay findable
        until reused."""
        if self.state_slots is not None:
            self.state_slots.free(seq)
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self._free[block_id] = None
                if self._block_hashes[block_id] is None:
                    self._free.move_to_end(block_id, last=False)
        seq.block_table.clear()
        seq.num_cached_blocks = 0

    def release_last_block(self, seq: Sequence) -> None:
        """Give back the last block of ``seq``'s table (speculative decoding: one that
        held only rejected draft tokens)."""
        block_id = seq.block_table.pop()
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            self._free[block_id] = None
            if self._block_hashes[block_id] is None:
                self._free.move_to_end(block_id, last=False)

    def _take_free_block(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        digest = self._block_hashes[block_id]
        if digest is not None:
            del self._cached[digest]
            self._block_hashes[block_id] = None
        self.ref_counts[block_id] = 1
        return block_id

    def _digests(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The digests of ``seq``'s first ``num_blocks`` blocks, each over the one
        before it and its own tokens; kept on the sequence, whose tokens only grow."""
        digests = seq.block_digests
        size = self.block_size
        while len(digests) < num_blocks:
            start = len(digests) * size
            # The first block's digest starts from the adapter's salt (the same prompt
            # under another adapter, or none, has other keys and values) and the
            # request's cache salt (another tenant's cache is not this one's).
            h = hashlib.blake2b(digests[-1] if digests else _salt(seq), digest_size=16)
            h.update(array("q", seq.token_ids[start : start + size]).tobytes())
            digests.append(h.digest())
        return digests[:num_blocks]


# Fingerprints tracked at most (each with its cut's digests): far more than a worker
# publishes, so the warm ones are found after many cold ones were evicted.
MAX_TRACKED_FINGERPRINTS = 1024


def _salt(seq: Sequence) -> bytes:
    lora = seq.request.lora
    return (b"" if lora is None else lora.cache_salt) + seq.request.cache_salt
