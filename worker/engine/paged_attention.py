"""Attention over the paged KV cache in one Triton kernel, for CUDA.

Every query token attends causally to its own sequence: positions ``0..pos`` read
through its row of the block table. A decode row and a prefill chunk are the same
case (a prefill token's context ends at its own position, and the step has
written the chunk's keys and values to the cache first), so a whole step, any mix
of both, is one launch whose shape is fixed by the number of tokens: a CUDA graph
can capture it. One program handles one token and one KV head: the query heads
that share that KV head, over the context in tiles, with an online softmax in
fp32. A padding token (position -1) reads nothing and writes zeros.

A layer's options are the kernel's arguments: a sliding ``window`` starts each
token's context ``window - 1`` positions before it (tiles before that are never
read); ``softcap`` caps each score as ``softcap * tanh(score / softcap)``; per-head
``sinks`` start the online softmax from the sink's logit, so it joins the
denominator and adds no value.

Contexts here are short (a few hundred tokens) and the heads few, so the tiles are
reduced with plain broadcasts rather than ``tl.dot``, whose 16-row minimum would
waste most of a tile on a group of three query heads.
"""

from __future__ import annotations

from typing import Any

import torch

try:  # Triton comes with CUDA builds of torch; CPU machines never call this module.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None

TILE_TOKENS = 64


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    token_row: torch.Tensor,
    token_pos: torch.Tensor,
    scale: float,
    block_size: int,
    window: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``q`` ``[tokens, heads, dim]``; caches ``[slots, kv_heads, dim]``; each token's
    ``token_row`` in ``block_tables`` (int32 ``[rows, blocks]``) and its position
    ``token_pos`` (-1: padding); ``window`` 0 and ``softcap`` 0 for none, ``sinks``
    fp32 ``[heads]``. Returns ``[tokens, heads, dim]``."""
    if triton is None:
        raise RuntimeError("paged attention needs triton, which CUDA builds of torch include")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    _kernel[(num_tokens, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        token_row,
        token_pos,
        q if sinks is None else sinks,  # not read without sinks
        scale,
        window,
        softcap,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        group_size=group,
        group_pad=triton.next_power_of_2(group),
        head_dim=head_dim,
        dim_pad=triton.next_power_of_2(head_dim),
        block_size=block_size,
        tile=TILE_TOKENS,
        has_window=window > 0,
        has_softcap=softcap > 0,
        has_sinks=sinks is not None,
    )
    return out


def _define_kernel() -> Any:
    if triton is None:
        return None

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def kernel(  # type: ignore[no-untyped-def]
        q_ptr,
        k_ptr,
        v_ptr,
        out_ptr,
        tables_ptr,
        row_ptr,
        pos_ptr,
        sinks_ptr,
        scale,
        window,
        softcap,
        stride_qt,
        stride_qh,
        stride_cs,
        stride_ch,
        stride_tr,
        stride_ot,
        stride_oh,
        group_size: tl.constexpr,
        group_pad: tl.constexpr,
        head_dim: tl.constexpr,
        dim_pad: tl.constexpr,
        block_size: tl.constexpr,
        tile: tl.constexpr,
        has_window: tl.constexpr,
        has_softcap: tl.constexpr,
        has_sinks: tl.constexpr,
    ):
        token = tl.program_id(0)
        kv_head = tl.program_id(1)
        context_len = tl.load(pos_ptr + token) + 1  # 0 for padding
        row = tl.load(row_ptr + token)
        lanes = tl.arange(0, group_pad)
        heads = kv_head * group_size + lanes
        dims = tl.arange(0, dim_pad)
        head_ok = lanes < group_size
        dim_ok = dims < head_dim
        q_mask = head_ok[:, None] & dim_ok[None, :]
        q_offsets = token * stride_qt + heads[:, None] * stride_qh + dims[None, :]
        q = tl.load(q_ptr + q_offsets, mask=q_mask, other=0.0).to(tl.float32) * scale
        m = tl.full([group_pad], float("-inf"), tl.float32)
        total = tl.zeros([group_pad], tl.float32)
        if has_sinks:
            # The sink's logit starts the softmax: exp(sink - m) = 1 in the denominator.
            m = tl.load(sinks_ptr + heads, mask=head_ok, other=float("-inf")).to(tl.float32)
            total = tl.where(head_ok, 1.0, 0.0)
        acc = tl.zeros([group_pad, dim_pad], tl.float32)
        first = 0
        if has_window:
            first = tl.maximum(context_len - window, 0)
        for start in range(first, context_len, tile):
            offs = start + tl.arange(0, tile)
            valid = offs < context_len
            block = tl.load(tables_ptr + row * stride_tr + offs // block_size, mask=valid, other=0)
            slots = block.to(tl.int64) * block_size + offs % block_size
            kv_offsets = slots[:, None] * stride_cs + kv_head * stride_ch + dims[None, :]
            kv_mask = valid[:, None] & dim_ok[None, :]
            k = tl.load(k_ptr + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
            if has_softcap:
                # softcap * tanh(scores / softcap), with tanh(x) = 2 sigmoid(2x) - 1
                scores = softcap * (2.0 * tl.sigmoid(2.0 * scores / softcap) - 1.0)
            scores = tl.where(valid[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m - m_new)
            v = tl.load(v_ptr + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)
            total = total * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m = m_new
        out = acc / tl.maximum(total, 1e-20)[:, None]
        out_offsets = token * stride_ot + heads[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)

    return kernel


_kernel = _define_kernel()
