"""Attention on the CPU: each token's context gathered from its blocks into SDPA.

Decode rows run as a few padded SDPAs over their contexts (rows of similar length
together), gathered from their blocks; each multi-token (prefill) chunk runs as its
own causal SDPA. Gathering into SDPA was chosen by measurement on the CPU: the
gather copies each decode row's context once per layer, which costs about what SDPA
itself does, and a step's linear layers dominate either way.
A prefill chunk at its sequence's start reads its own new keys and values and
gathers nothing. Every index is a tensor built once per step, for each window size
the model's layers use: a sliding-window layer gathers only the window.

SDPA has neither logit soft-capping nor sinks: layers with either run the same
gathered context through :func:`masked_attention` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn import functional

from worker.engine.attention import AttentionSpec, write_kv
from worker.engine.step_inputs import StepInputs

# A decode group's rows are at least this share of its longest row's context, and a
# step has at most MAX_DECODE_GROUPS (each costs a gather and an SDPA a layer).
GROUP_SHARE = 0.6
MAX_DECODE_GROUPS = 4

Window = int | None


def group_by_length(context_lens: list[int]) -> list[list[int]]:
    """Decode rows (indices into ``context_lens``) in groups of similar length, longest
    first: padding every row to the step's longest context would gather and attend
    over that much padding in every layer."""
    order = sorted(range(len(context_lens)), key=lambda r: -context_lens[r])
    groups: list[list[int]] = []
    for row in order:
        last = len(groups) == MAX_DECODE_GROUPS
        if groups and (last or context_lens[row] >= GROUP_SHARE * context_lens[groups[-1][0]]):
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


@dataclass
class Context:
    """What some query tokens read: cache ``slots`` (None: the chunk's own new keys and
    values) and ``mask`` (True: attend; None: nothing to hide, that is decode rows whose
    contexts all fill the width, or plain causal over a chunk's own keys and values)."""

    slots: torch.Tensor | None
    mask: torch.Tensor | None


@dataclass
class DecodeGroup:
    """Decode rows of similar context length, one padded SDPA: the step's tokens
    ``token_index`` read ``[rows, context]`` slots (padded with an always-zero slot),
    per window size."""

    token_index: torch.Tensor
    contexts: dict[Window, Context] = field(default_factory=dict)


@dataclass
class PrefillChunk:
    """A multi-token chunk of one sequence: tokens ``token_start:token_end`` of the
    step, at positions from ``start_pos``; what it reads, per window size."""

    token_start: int
    token_end: int
    start_pos: int
    contexts: dict[Window, Context] = field(default_factory=dict)


@dataclass
class CpuStep:
    """A step's attention on the CPU (see the module docs). The caches are one pool
    per layer, ``[slots, kv_heads, head_dim]``; ``slot_mapping`` is where each new
    token's key and value go."""

    key_cache: list[torch.Tensor]
    value_cache: list[torch.Tensor]
    slot_mapping: torch.Tensor
    decode_groups: list[DecodeGroup]
    prefills: list[PrefillChunk]

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec
    ) -> torch.Tensor:
        k_cache, v_cache = write_kv(self.key_cache[layer], self.value_cache[layer], self, k, v)
        if not self.prefills and len(self.decode_groups) == 1:
            # Every token is a decode row of the one group, in order (``CpuBackend.step``).
            return _decode(q, k_cache, v_cache, self.decode_groups[0].contexts[spec.window], spec)
        out = torch.empty_like(q)
        for group in self.decode_groups:
            context = group.contexts[spec.window]
            out[group.token_index] = _decode(q[group.token_index], k_cache, v_cache, context, spec)
        for chunk in self.prefills:
            span = slice(chunk.token_start, chunk.token_end)
            context = chunk.contexts[spec.window]
            if context.slots is None:
                keys, values = k[span], v[span]
            else:
                keys = k_cache.index_select(0, context.slots)
                values = v_cache.index_select(0, context.slots)
            out[span] = _prefill(q[span], keys, values, context.mask, spec)
        return out


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    context: Context,
    spec: AttentionSpec,
) -> torch.Tensor:
    """One query per row against its gathered context. Query heads sharing a KV head
    become that head's query rows, so grouped-query attention needs no repeated keys."""
    assert context.slots is not None
    num_rows, context_len = context.slots.shape
    assert q.shape[0] == num_rows, "one query token per decode row"
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    slots = context.slots.view(-1)
    shape = (num_rows, context_len, num_kv_heads, head_dim)
    keys = k_cache.index_select(0, slots).view(shape).transpose(1, 2)
    values = v_cache.index_select(0, slots).view(shape).transpose(1, 2)
    rows = q.view(num_rows, num_kv_heads, -1, head_dim)  # [rows, kv_heads, group, dim]
    mask = context.mask  # [rows, context], broadcast over heads, groups (and queries)
    if spec.plain:
        attn = functional.scaled_dot_product_attention(
            rows,
            keys,
            values,
            attn_mask=None if mask is None else mask[:, None, None, :],
            scale=spec.scale,
        )
        return attn.reshape(num_rows, -1, head_dim)
    if mask is not None:
        mask = mask[:, None, None, None, :]
    out = masked_attention(rows[:, :, :, None], keys, values, mask, spec)
    return out.reshape(num_rows, -1, head_dim)


def _prefill(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    spec: AttentionSpec,
) -> torch.Tensor:
    """A chunk's queries ``[n, heads, dim]`` against ``[context, kv_heads, dim]``."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    if spec.plain:
        attn = functional.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            is_causal=mask is None,
            scale=spec.scale,
            enable_gqa=True,
        )
        return attn[0].transpose(0, 1)
    if mask is None:
        mask = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=q.device).tril()
    rows = q.view(num_tokens, num_kv_heads, -1, head_dim).permute(1, 2, 0, 3)[None]
    out = masked_attention(
        rows, keys.transpose(0, 1)[None], values.transpose(0, 1)[None], mask, spec
    )
    return out[0].permute(2, 0, 1, 3).reshape(num_tokens, num_heads, head_dim)


def masked_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    spec: AttentionSpec,
) -> torch.Tensor:
    """Attention as transformers' eager forward computes it, with soft-cap and sinks:
    ``q`` ``[batch, kv_heads, group, queries, dim]``, ``keys`` and ``values``
    ``[batch, kv_heads, context, dim]``, ``mask`` broadcast to the scores
    ``[batch, kv_heads, group, queries, context]`` (True: attend; None: every key)."""
    scores = torch.matmul(q, keys[:, :, None].transpose(-1, -2)) * spec.scale
    if spec.softcap is not None:
        scores = torch.tanh(scores / spec.softcap) * spec.softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if spec.sinks is not None:
        sinks = spec.sinks.to(scores.dtype).view(1, q.shape[1], q.shape[2], 1, 1)
        scores = torch.cat([scores, sinks.expand(*scores.shape[:-1], 1)], dim=-1)
    probs = torch.softmax(scores.float(), dim=-1).to(values.dtype)
    if spec.sinks is not None:
        probs = probs[..., :-1]
    return torch.matmul(probs, values[:, :, None])


class CpuBackend:
    """Builds each step's :class:`CpuStep` from its host inputs: the decode groups and
    prefill chunks, and what they read for each window size the layers use."""

    def __init__(
        self,
        key_cache: list[torch.Tensor],
        value_cache: list[torch.Tensor],
        block_size: int,
        null_slot: int,
        windows: set[Window],
    ) -> None:
        self.key_cache, self.value_cache = key_cache, value_cache
        self.block_size = block_size
        self.null_slot = null_slot
        self.windows = windows | {None}
        self.device = key_cache[0].device

    def step(self, inputs: StepInputs) -> CpuStep:
        decode = [r for r, n in enumerate(inputs.row_num_tokens) if n == 1]
        lens = [inputs.row_start_pos[r] + 1 for r in decode]
        # Each group's rows in step order: a step of decode rows alone in one group then
        # has its tokens in the group's order, and attends with no scatter back.
        groups = [sorted(decode[i] for i in group) for group in group_by_length(lens)]
        chunks = [r for r, n in enumerate(inputs.row_num_tokens) if n > 1]
        return CpuStep(
            self.key_cache,
            self.value_cache,
            self._tensor(inputs.slot_mapping),
            [self._decode_group(inputs, rows) for rows in groups],
            [self._prefill_chunk(inputs, row) for row in chunks],
        )

    def _decode_group(self, inputs: StepInputs, rows: list[int]) -> DecodeGroup:
        tables = [inputs.tables[r] for r in rows]
        ends = [inputs.row_start_pos[r] + 1 for r in rows]
        group = DecodeGroup(self._tensor([inputs.row_starts[r] for r in rows]))
        full = self._context(tables, [0] * len(rows), ends)
        for window in self.windows:
            if window is None or window >= max(ends):
                group.contexts[window] = full  # the window holds every row's whole context
            else:
                group.contexts[window] = self._context(
                    tables, [max(0, end - window) for end in ends], ends
                )
        return group

    def _context(self, tables: list[list[int]], starts: list[int], ends: list[int]) -> Context:
        """``[rows, width]`` slots of positions ``starts[r]..ends[r] - 1`` of each row,
        padded with the zero slot, and the mask that hides the padding."""
        size = self.block_size
        num_blocks = -(-max(ends) // size)
        null_block = self.null_slot // size
        padded = [[*t[:num_blocks], *[null_block] * (num_blocks - len(t))] for t in tables]
        width = max(e - s for s, e in zip(starts, ends, strict=True))
        positions = self._tensor(starts)[:, None] + torch.arange(width, device=self.device)
        full = all(e - s == width for s, e in zip(starts, ends, strict=True))
        valid = None if full else positions < self._tensor(ends)[:, None]
        positions = positions.clamp(max=num_blocks * size - 1)
        blocks = self._tensor(padded).gather(1, positions // size)
        slots = blocks * size + positions % size
        if valid is None:
            return Context(slots, None)  # no padding to hide: SDPA without a mask costs less
        return Context(slots.masked_fill(~valid, self.null_slot), valid)

    def _prefill_chunk(self, inputs: StepInputs, row: int) -> PrefillChunk:
        start, num_tokens = inputs.row_starts[row], inputs.row_num_tokens[row]
        start_pos = inputs.row_start_pos[row]
        chunk = PrefillChunk(start, start + num_tokens, start_pos)
        end_pos = start_pos + num_tokens
        for window in sorted(self.windows, key=lambda w: w is not None):  # None first
            if window is None or window >= end_pos:  # the window holds the whole context
                chunk.contexts[window] = chunk.contexts.get(None) or self._chunk_context(
                    inputs.tables[row], start_pos, end_pos, None
                )
            else:
                chunk.contexts[window] = self._chunk_context(
                    inputs.tables[row], start_pos, end_pos, window
                )
        return chunk

    def _chunk_context(
        self, table: list[int], start_pos: int, end_pos: int, window: Window
    ) -> Context:
        """What a chunk at ``start_pos..end_pos - 1`` reads: at its sequence's start,
        its own keys and values; past it, its context from the cache."""
        first = 0 if window is None else max(0, start_pos - window + 1)
        queries = torch.arange(start_pos, end_pos, device=self.device)[:, None]
        keys = torch.arange(first, end_pos, device=self.device)[None, :]
        mask = keys <= queries
        if window is not None:
            mask &= keys > queries - window
        if start_pos == 0:
            return Context(None, None if window is None else mask)
        slots = self._context([table], [first], [end_pos]).slots
        assert slots is not None
        return Context(slots[0], mask)

    def _tensor(self, values: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)
