"""Mamba-2, the state-space layer of Granite 4.0-H, with its state per sequence
(``worker.engine.models.state``).

One projection gives, per token, the gate, the convolution's input (``x``, ``B`` and
``C``) and each head's time step ``dt``; a causal depthwise convolution over the last
``kernel`` tokens (SiLU) mixes ``x``, ``B`` and ``C``; the selective scan carries a
``[head_dim, state]`` matrix per head from token to token (decay ``exp(dt * A)``,
input ``dt * B x``, read out by ``C``, plus ``D x``); the result, gated by
``silu(gate)``, is RMS-normalised per group and projected out. The state of a
sequence is the convolution's window (its last ``kernel - 1`` inputs) and the SSM
matrices (fp32, as transformers keeps them). The scan runs as transformers' own:
chunked over a prefill chunk, token by token for decode rows.

``dt`` is clamped to the config's ``time_step_limit`` on every token, prefill and
decode alike, which is the model's definition; transformers' decode step skips the
clamp, so with a finite limit its ``generate`` differs from its own forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional
from transformers.models.granitemoehybrid.modeling_granitemoehybrid import (
    mamba2_chunk_scan,
    mamba2_selective_state_update,
)

from worker.engine.models.layers import Projection
from worker.engine.models.state import GatedRMSNorm, StateShapes, causal_conv, scan_rows


class Mamba2:
    def __init__(self, module: Any, config: Any) -> None:
        self.num_heads, self.head_dim = int(module.num_heads), int(module.head_dim)
        self.num_groups, self.state_size = int(module.n_groups), int(module.ssm_state_size)
        self.intermediate = int(module.intermediate_size)
        self.conv_dim, self.kernel = int(module.conv_dim), int(module.conv_kernel_size)
        self.chunk_size = int(module.chunk_size)
        self.in_proj = Projection.of(module.in_proj)
        self.out_proj = Projection.of(module.out_proj)
        self.conv_weight = module.conv1d.weight.detach().squeeze(1)
        self.conv_bias = None if module.conv1d.bias is None else module.conv1d.bias.detach()
        self.activation = str(module.activation)
        self.a = -module.A_log.detach().float().exp()
        self.d, self.dt_bias = module.D.detach(), module.dt_bias.detach()
        self.dt_limit = tuple(module.time_step_limit or (0.0, float("inf")))
        self.norm = GatedRMSNorm(module.norm, gate_first=True, num_groups=self.num_groups)
        self.state_index = 0

    def state_shapes(self, dtype: torch.dtype) -> StateShapes:
        ssm = (self.num_heads, self.head_dim, self.state_size)
        return [((self.conv_dim, self.kernel - 1), dtype), (ssm, torch.float32)]

    def __call__(self, index: int, h: torch.Tensor, ropes: Any, batch: Any) -> torch.Tensor:
        gate, xbc, dt = torch.split(
            self.in_proj(h), [self.intermediate, self.conv_dim, self.num_heads], dim=-1
        )
        out = scan_rows(batch.state, self.state_index, (xbc, dt), self._rows)
        return self.out_proj(self.norm(out, gate).to(h.dtype))

    def _rows(
        self, xs: tuple[torch.Tensor, ...], states: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        xbc, dt = xs
        conv_state, ssm = states
        num_rows, num_tokens = xbc.shape[:2]
        xbc = causal_conv(
            xbc.transpose(1, 2), conv_state, self.conv_weight, self.conv_bias, self.activation
        ).transpose(1, 2)
        group_width = self.num_groups * self.state_size
        x, b, c = torch.split(xbc, [self.intermediate, group_width, group_width], dim=-1)
        if num_tokens == 1:
            out = self._step(x, dt, b, c, ssm)
        else:
            out, ssm = mamba2_chunk_scan(
                x.reshape(num_rows, num_tokens, self.num_heads, self.head_dim),
                dt,
                self.a,
                b.reshape(num_rows, num_tokens, self.num_groups, self.state_size),
                c.reshape(num_rows, num_tokens, self.num_groups, self.state_size),
                chunk_size=self.chunk_size,
                D=self.d,
                dt_bias=self.dt_bias,
                initial_states=ssm,
                dt_softplus=True,
                dt_limit=self.dt_limit,
                return_final_states=True,
            )
        # fp32 into the norm, as transformers' chunked scan gives it (its step gives the
        # model's dtype): a prompt's tokens rounded to bf16 there would drift.
        return out.float().reshape(num_rows, num_tokens, self.intermediate), [conv_state, ssm]

    def _step(
        self, x: torch.Tensor, dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor, ssm: torch.Tensor
    ) -> torch.Tensor:
        """One token of each row, advancing ``ssm`` ``[rows, heads, head_dim, state]`` in
        place (as transformers' decode step, with the clamp of its chunked scan). In
        fp32, as mamba_ssm's kernel computes it: transformers' torch step would round
        the update and the read-out to a bf16 model's dtype, which its chunked scan
        (and so its own forward) does not."""
        num_rows = x.shape[0]
        dt = functional.softplus(dt + self.dt_bias).clamp(*self.dt_limit)
        dt = dt.transpose(1, 2).expand(-1, -1, self.head_dim).float()
        out: torch.Tensor = mamba2_selective_state_update(
            ssm,
            x.reshape(num_rows, self.num_heads, self.head_dim).float(),
            dt,
            self.a[:, None, None].expand(-1, self.head_dim, self.state_size),
            b.reshape(num_rows, self.num_groups, self.state_size).float(),
            c.reshape(num_rows, self.num_groups, self.state_size).float(),
            self.d[:, None].expand(-1, self.head_dim),
            z=None,
            dt_bias=None,
            dt_softplus=False,
        )
        return out
