"""Gated DeltaNet, the linear attention of Qwen3.5 and Qwen3-Next, with its state per
sequence (``worker.engine.models.state``).

One projection gives, per token, the convolution's input (queries, keys and values),
the output gate ``z`` and each value head's ``b`` (write strength, ``sigmoid``) and
``a`` (decay); a causal depthwise convolution over the last ``kernel`` tokens (SiLU)
mixes queries, keys and values; the gated delta rule carries a ``[key, value]``
matrix per value head from token to token; the result is RMS-normalised, gated by
``silu(z)`` and projected out. The state of a sequence is the convolution's window
(its last ``kernel - 1`` inputs) and the recurrent matrices (fp32, as transformers
keeps them). The rule runs as transformers' own: chunked over a prefill chunk, token
by token for decode rows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional
from transformers.models.qwen3_next.modeling_qwen3_next import (
    l2norm,
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)

from worker.engine.models.layers import Projection, fused_projection
from worker.engine.models.state import GatedRMSNorm, StateShapes, causal_conv, scan_rows

# The input projections of each layout: Qwen3.5's four, Qwen3-Next's two (whose outputs
# are grouped per key head).
QWEN3_5_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
QWEN3_NEXT_PROJECTIONS = ("in_proj_qkvz", "in_proj_ba")


class GatedDeltaNet:
    def __init__(self, module: Any, config: Any, grouped: bool) -> None:
        self.num_k_heads = int(module.num_k_heads)
        self.num_v_heads = int(module.num_v_heads)
        self.head_k_dim, self.head_v_dim = int(module.head_k_dim), int(module.head_v_dim)
        self.key_dim, self.value_dim = int(module.key_dim), int(module.value_dim)
        self.conv_dim = int(module.conv_dim)
        self.kernel = int(module.conv_kernel_size)
        self.grouped = grouped
        names = QWEN3_NEXT_PROJECTIONS if grouped else QWEN3_5_PROJECTIONS
        self.in_proj = fused_projection(module, names)
        self.conv_weight = module.conv1d.weight.detach().squeeze(1)
        self.conv_bias = None if module.conv1d.bias is None else module.conv1d.bias.detach()
        self.activation = str(module.activation)
        self.neg_a = -module.A_log.detach().float().exp()
        self.dt_bias = module.dt_bias.detach()
        self.norm = GatedRMSNorm(module.norm, gate_first=False)
        self.out_proj = Projection.of(module.out_proj)
        self.state_index = 0

    @classmethod
    def qwen3_5(cls, module: Any, config: Any) -> GatedDeltaNet:
        return cls(module, config, grouped=False)

    @classmethod
    def qwen3_next(cls, module: Any, config: Any) -> GatedDeltaNet:
        return cls(module, config, grouped=True)

    def state_shapes(self, dtype: torch.dtype) -> StateShapes:
        recurrent = (self.num_v_heads, self.head_k_dim, self.head_v_dim)
        return [((self.conv_dim, self.kernel - 1), dtype), (recurrent, torch.float32)]

    def __call__(self, index: int, h: torch.Tensor, ropes: Any, batch: Any) -> torch.Tensor:
        num_tokens = h.shape[0]
        qkv, z, b, a = self._split(self.in_proj(h))
        beta = b.sigmoid()
        g = self.neg_a * functional.softplus(a.float() + self.dt_bias)
        out = scan_rows(batch.state, self.state_index, (qkv, beta, g), self._rows)
        out = self.norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim)).reshape(
            num_tokens, self.value_dim
        )
        return self.out_proj(out)

    def _split(
        self, projected: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The convolution's input ``[tokens, q | k | v]``, ``z``, ``b`` and ``a``."""
        if not self.grouped:
            widths = [self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads]
            qkv, z, b, a = torch.split(projected, widths, dim=-1)
            return qkv, z, b, a
        num_tokens, ratio = projected.shape[0], self.num_v_heads // self.num_k_heads
        qkvz_width = 2 * self.key_dim + 2 * self.value_dim
        qkvz = projected[:, :qkvz_width].view(num_tokens, self.num_k_heads, -1)
        ba = projected[:, qkvz_width:].view(num_tokens, self.num_k_heads, 2 * ratio)
        k_dim, v_width = self.head_k_dim, ratio * self.head_v_dim
        q, k, v, z = torch.split(qkvz, [k_dim, k_dim, v_width, v_width], dim=-1)
        b, a = torch.split(ba, [ratio, ratio], dim=-1)
        qkv = torch.cat([x.reshape(num_tokens, -1) for x in (q, k, v)], dim=-1)
        return (
            qkv,
            z.reshape(num_tokens, -1),
            b.reshape(num_tokens, -1),
            a.reshape(num_tokens, -1),
        )

    def _rows(
        self, xs: tuple[torch.Tensor, ...], states: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        qkv, beta, g = xs
        conv_state, recurrent = states
        num_rows, num_tokens = qkv.shape[:2]
        mixed = causal_conv(
            qkv.transpose(1, 2), conv_state, self.conv_weight, self.conv_bias, self.activation
        ).transpose(1, 2)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(num_rows, num_tokens, -1, self.head_k_dim)
        k = k.reshape(num_rows, num_tokens, -1, self.head_k_dim)
        v = v.reshape(num_rows, num_tokens, -1, self.head_v_dim)
        rule = torch_chunk_gated_delta_rule
        if num_tokens == 1:
            on_cpu = q.device.type == "cpu"
            rule = decode_gated_delta_rule if on_cpu else torch_recurrent_gated_delta_rule
        out, recurrent = rule(
            q,
            k,
            v,
            g=g,
            beta=beta,
            initial_state=recurrent,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        return out, [conv_state, recurrent]


def decode_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    output_final_state: bool = True,
    use_qk_l2norm_in_kernel: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``torch_recurrent_gated_delta_rule`` for one token a row (decode
    rows, on the CPU), in fewer operations: no copies to a heads-first layout, and the
    state's products with the key and the query as matrix products rather than a
    product and a sum (the same sums in another order, in fewer operations, which is
    what a decode row's time goes to). ``query`` and ``key`` ``[rows, 1, key heads,
    key dim]``, ``value``
    ``[rows, 1, heads, value dim]``, ``g`` and ``beta`` ``[rows, 1, heads]``, the state
    ``[rows, heads, key dim, value dim]``; returns the output as ``value`` and the state."""
    assert output_final_state and use_qk_l2norm_in_kernel  # as the layer calls it
    group = value.shape[2] // key.shape[2]
    q = l2norm(query[:, 0].float(), dim=-1, eps=1e-6)
    k = l2norm(key[:, 0].float(), dim=-1, eps=1e-6)
    if group > 1:
        q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
    q = q / (q.shape[-1] ** 0.5)
    state = initial_state.float() * g[:, 0].float().exp()[..., None, None]
    remembered = torch.matmul(k.unsqueeze(-2), state).squeeze(-2)
    delta = (value[:, 0].float() - remembered) * beta[:, 0].float().unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    out = torch.matmul(q.unsqueeze(-2), state).squeeze(-2)
    return out.unsqueeze(1).to(query.dtype), state
