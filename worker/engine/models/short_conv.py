"""LFM2's short convolution, with its state per sequence (``worker.engine.models.state``).

One projection gives, per token, ``B``, ``C`` and ``x``; ``B * x`` goes through a causal
depthwise convolution over the last ``kernel`` tokens; the result times ``C`` is
projected out. The state of a sequence is the convolution's window: its last
``kernel - 1`` inputs.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.engine.models.layers import Projection
from worker.engine.models.state import StateShapes, causal_conv, scan_rows


class ShortConv:
    def __init__(self, module: Any, config: Any) -> None:
        self.in_proj = Projection.of(module.in_proj)
        self.out_proj = Projection.of(module.out_proj)
        self.conv_weight = module.conv.weight.detach().squeeze(1)
        self.conv_bias = None if module.conv.bias is None else module.conv.bias.detach()
        self.channels, self.kernel = int(self.conv_weight.shape[0]), int(module.conv_kernel_size)
        self.state_index = 0

    def state_shapes(self, dtype: torch.dtype) -> StateShapes:
        return [((self.channels, self.kernel - 1), dtype)]

    def __call__(self, index: int, h: torch.Tensor, ropes: Any, batch: Any) -> torch.Tensor:
        b, c, x = self.in_proj(h).chunk(3, dim=-1)
        conv = scan_rows(batch.state, self.state_index, (b * x,), self._rows)
        return self.out_proj(c * conv)

    def _rows(
        self, xs: tuple[torch.Tensor, ...], states: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        (bx,) = xs
        (conv_state,) = states
        out = causal_conv(bx.transpose(1, 2), conv_state, self.conv_weight, self.conv_bias)
        return out.transpose(1, 2), [conv_state]
