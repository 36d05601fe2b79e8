"""Attention over the engine's own KV cache, plugged into transformers models.

A step flattens every scheduled token into one sequence (batch 1) with explicit
position ids, so the linear layers see one dense matrix. transformers calls
:func:`tokenq_attention` in each layer with a :class:`StepBatch` passed through
the forward kwargs; it writes the new keys and values into the cache, then runs
single-token (decode) rows as one padded SDPA over their slots' rows of the cache
and each multi-token (prefill) chunk as its own causal SDPA.

The cache keeps one row per slot, ``[slots, kv_heads, capacity, head_dim]``, so a
decode batch reads a strided view of it with no gather.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional
from transformers import AttentionInterface

ATTN_IMPLEMENTATION = "tokenq"


@dataclass
class PrefillChunk:
    token_start: int
    token_end: int
    slot: int
    start_pos: int


@dataclass
class StepBatch:
    """Where this step's tokens go in the cache and what each may attend to."""

    key_cache: list[torch.Tensor]
    value_cache: list[torch.Tensor]
    write_slots: torch.Tensor
    write_positions: torch.Tensor
    decode_token_index: torch.Tensor
    decode_slots: torch.Tensor
    decode_mask: torch.Tensor | None
    prefills: list[PrefillChunk]


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
    batch: StepBatch,
    scaling: float | None,
) -> torch.Tensor:
    """Token-major attention: ``q`` is ``[tokens, heads, dim]``, ``k`` and ``v``
    ``[tokens, kv_heads, dim]``; writes ``k`` and ``v`` to the cache first."""
    k_cache, v_cache = batch.key_cache[layer], batch.value_cache[layer]
    k_cache[batch.write_slots, :, batch.write_positions] = k
    v_cache[batch.write_slots, :, batch.write_positions] = v
    out = torch.empty_like(q)
    if batch.decode_mask is not None:
        out[batch.decode_token_index] = _decode(
            q, k_cache, v_cache, batch, batch.decode_mask, scaling
        )
    for chunk in batch.prefills:
        out[chunk.token_start : chunk.token_end] = _prefill(q, k_cache, v_cache, chunk, scaling)
    return out


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: StepBatch,
    mask: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """Decode rows: one query per sequence against its row of the cache.

    Query heads sharing a KV head become that head's query rows, so grouped-query
    attention needs no repeated keys.
    """
    num_rows, context_len = mask.shape[0], mask.shape[-1]
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    rows = q.new_zeros(num_rows, q.shape[1], head_dim)
    rows[batch.decode_slots] = q[batch.decode_token_index]
    rows = rows.view(num_rows, num_kv_heads, -1, head_dim)
    keys = k_cache[:num_rows, :, :context_len]
    values = v_cache[:num_rows, :, :context_len]
    attn = functional.scaled_dot_product_attention(
        rows, keys, values, attn_mask=mask, scale=scaling
    )
    return attn.reshape(num_rows, -1, head_dim)[batch.decode_slots]


def _prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: PrefillChunk,
    scaling: float | None,
) -> torch.Tensor:
    num_tokens = chunk.token_end - chunk.token_start
    context_len = chunk.start_pos + num_tokens
    query = q[chunk.token_start : chunk.token_end].transpose(0, 1).unsqueeze(0)
    keys = k_cache[chunk.slot : chunk.slot + 1, :, :context_len]
    values = v_cache[chunk.slot : chunk.slot + 1, :, :context_len]
    mask = None
    if chunk.start_pos:
        positions = torch.arange(context_len, device=q.device)
        mask = positions[None, :] <= positions[chunk.start_pos :, None]
    attn = functional.scaled_dot_product_attention(
        query,
        keys,
        values,
        attn_mask=mask,
        is_causal=mask is None,
        scale=scaling,
        enable_gqa=True,
    )
    return attn[0].transpose(0, 1)


AttentionInterface.register(ATTN_IMPLEMENTATION, tokenq_attention)
