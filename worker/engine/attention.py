"""Attention over the engine's own KV cache, plugged into transformers models.

A step flattens every scheduled token into one sequence (batch 1) with explicit
position ids, so the linear layers see one dense matrix. transformers calls
:func:`tokenq_attention` in each layer with a :class:`StepBatch` passed through
the forward kwargs; it writes the new keys and values into the paged cache, then
runs single-token (decode) rows as a few padded SDPAs over their contexts (rows of
similar length together), gathered from their blocks, and each multi-token
(prefill) chunk as its own causal SDPA.

Gathering into SDPA was chosen by measurement on the CPU. The gather copies each
decode row's context once per layer: for 64 rows of 170 tokens of SmolLM2-135M,
about 2 ms a layer on one core against SDPA's own 1.7 ms, which leaves the engine's
throughput on mixed32 where the per-slot cache had it (72.6 and 98.8 tok/s against
73.3 and 84.8, interleaved runs on one thread), since a step's linear layers
dominate. A prefill chunk at its sequence's start reads its own new keys and values
and gathers nothing. Every index is a tensor built once per step (slot mapping,
per-row context slots).

On CUDA the fused forward passes a :class:`PagedStep` instead: one Triton kernel
(``worker.engine.paged_attention``) reads every token's context through its block
table, for decode rows and prefill chunks alike, so a whole step has fixed shapes
and runs as a captured CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional
from transformers import AttentionInterface

from worker.engine.paged_attention import paged_attention

ATTN_IMPLEMENTATION = "tokenq"


@dataclass
class PrefillChunk:
    """A multi-token chunk of one sequence: tokens ``token_start:token_end`` of the
    step, at positions from ``start_pos``. Past the start of its sequence it reads
    its context from the cache (``context_slots``, with ``mask`` for causality);
    at the start, only its own new keys and values."""

    token_start: int
    token_end: int
    start_pos: int
    context_slots: torch.Tensor | None = None
    mask: torch.Tensor | None = None


@dataclass
class DecodeGroup:
    """Decode rows of similar context length, run as one padded SDPA: the step's
    tokens ``token_index`` read their contexts through ``slots`` (``[rows, context]``,
    padded with an always-zero slot) under ``mask``."""

    token_index: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor


# A decode group's rows are at least this share of its longest row's context, and a
# step has at most MAX_DECODE_GROUPS (each costs a gather and an SDPA a layer).
GROUP_SHARE = 0.6
MAX_DECODE_GROUPS = 4


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
class StepBatch:
    """Where this step's tokens go in the cache and what each may attend to.

    The caches are one pool per layer, ``[slots, kv_heads, head_dim]``, a slot per
    token (block ``b`` holds slots ``b * block_size`` on). ``slot_mapping`` is
    where each new token's key and value go. Decode rows come in groups of similar
    context length, so that a short row is not padded to the longest one.
    """

    key_cache: list[torch.Tensor]
    value_cache: list[torch.Tensor]
    slot_mapping: torch.Tensor
    decode_groups: list[DecodeGroup]
    prefills: list[PrefillChunk]


@dataclass
class PagedStep:
    """A step's attention inputs for the paged kernel: each token's cache slot, its
    row of ``block_tables`` (int32 ``[rows, blocks]``) and position (-1: padding,
    which a captured graph's bucket adds and whose slot is a scratch one)."""

    key_cache: list[torch.Tensor]
    value_cache: list[torch.Tensor]
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    token_row: torch.Tensor
    token_pos: torch.Tensor
    block_size: int


def tokenq_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    tokenq_batch: StepBatch | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The transformers attention interface: ``query`` is ``[1, heads, tokens, dim]``;
    returns ``[1, tokens, heads, dim]``."""
    if tokenq_batch is None:
        raise RuntimeError("tokenq attention runs only inside the tokenq engine")
    layer = int(getattr(module, "layer_idx", 0))
    out = attend(
        layer,
        query[0].transpose(0, 1),
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        tokenq_batch,
        scaling,
    )
    return out.unsqueeze(0), None


def attend(
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch: StepBatch | PagedStep,
    scaling: float | None,
) -> torch.Tensor:
    """Token-major attention: ``q`` is ``[tokens, heads, dim]``, ``k`` and ``v``
    ``[tokens, kv_heads, dim]``; writes ``k`` and ``v`` to the cache first, so that
    a chunk reading a block another row of this step writes sees its new contents."""
    k_cache, v_cache = batch.key_cache[layer], batch.value_cache[layer]
    k_cache.index_copy_(0, batch.slot_mapping, k)
    v_cache.index_copy_(0, batch.slot_mapping, v)
    if isinstance(batch, PagedStep):
        scale = q.shape[-1] ** -0.5 if scaling is None else scaling
        return paged_attention(
            q,
            k_cache,
            v_cache,
            batch.block_tables,
            batch.token_row,
            batch.token_pos,
            scale,
            batch.block_size,
        )
    out = torch.empty_like(q)
    for group in batch.decode_groups:
        out[group.token_index] = _decode(q, k_cache, v_cache, group, scaling)
    for chunk in batch.prefills:
        out[chunk.token_start : chunk.token_end] = _prefill(
            q, k, v, k_cache, v_cache, chunk, scaling
        )
    return out


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: DecodeGroup,
    scaling: float | None,
) -> torch.Tensor:
    """Decode rows: one query per sequence against its context, gathered from its
    blocks into one padded SDPA.

    Query heads sharing a KV head become that head's query rows, so grouped-query
    attention needs no repeated keys.
    """
    num_rows, context_len = group.slots.shape
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    rows = q[group.token_index].view(num_rows, num_kv_heads, -1, head_dim)
    slots = group.slots.view(-1)
    keys = k_cache.index_select(0, slots).view(num_rows, context_len, num_kv_heads, head_dim)
    values = v_cache.index_select(0, slots).view(num_rows, context_len, num_kv_heads, head_dim)
    attn = functional.scaled_dot_product_attention(
        rows,
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=group.mask,
        scale=scaling,
    )
    return attn.reshape(num_rows, -1, head_dim)


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: PrefillChunk,
    scaling: float | None,
) -> torch.Tensor:
    query = q[chunk.token_start : chunk.token_end].transpose(0, 1).unsqueeze(0)
    if chunk.context_slots is None:
        keys = k[chunk.token_start : chunk.token_end]
        values = v[chunk.token_start : chunk.token_end]
    else:
        keys = k_cache.index_select(0, chunk.context_slots)
        values = v_cache.index_select(0, chunk.context_slots)
    attn = functional.scaled_dot_product_attention(
        query,
        keys.transpose(0, 1).unsqueeze(0),
        values.transpose(0, 1).unsqueeze(0),
        attn_mask=chunk.mask,
        is_causal=chunk.mask is None,
        scale=scaling,
        enable_gqa=True,
    )
    return attn[0].transpose(0, 1)


AttentionInterface.register(ATTN_IMPLEMENTATION, tokenq_attention)
