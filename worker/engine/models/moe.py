"""A sparse mixture-of-experts MLP (Qwen3-MoE, Mixtral, gpt-oss).

Each token's router picks its top-k experts with a weight each; the token's
(token, expert) pairs are sorted by expert, so each expert's rows are contiguous,
and every expert's projections run as one grouped matmul (``torch._grouped_mm``,
with the experts' offsets as a device tensor: no host sync, so a CUDA graph can
capture it where the fast kernel exists). The weights are transformers' own
expert tensors, viewed as ``[experts, in, out]``; nothing is copied.

On the CPU (fp32, with oneDNN) each expert's projections are instead
``Projection`` objects (``layers.py``), their weights reordered once into oneDNN's
blocked layout as the dense layers' are, and the experts run one after the
other on their rows: ``_grouped_mm`` there is a loop of MKL matmuls, each of which
packs its expert's weight again for a handful of rows (a decode step's 32 rows give
each of 8 experts about 8), and for so few rows the packing outweighs the matmul.
The counts per expert are read on the host, which on the CPU costs no sync.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import torch
from torch.nn import functional

from worker.engine.lora import LoraBatch
from worker.engine.models.family import ExpertActivation, Moe, Router
from worker.engine.models.layers import Projection


class SparseMoe:
    def __init__(self, mlp: Any, moe: Moe, config: Any) -> None:
        router, experts = getattr(mlp, moe.router), mlp.experts
        self.router_weight: torch.Tensor = router.weight.detach()
        bias = getattr(router, "bias", None)
        self.router_bias = None if bias is None else bias.detach()
        self.top_k = int(router.top_k)
        self.num_experts = int(experts.num_experts)
        self.rule = moe.rule
        self.renormalize = moe.renormalize(config)
        self.gate_up = _in_out(experts.gate_up_proj, moe.transposed)
        self.down = _in_out(experts.down_proj, moe.transposed)
        self.gate_up_bias = _optional(experts, "gate_up_proj_bias")
        self.down_bias = _optional(experts, "down_proj_bias")
        self.activation = moe.activation
        self.act = getattr(experts, "act_fn", None)
        self.alpha = float(getattr(experts, "alpha", 0.0))
        self.limit = float(getattr(experts, "limit", 0.0))
        self.packed = _packed_experts(self.gate_up, self.gate_up_bias, self.down, self.down_bias)

    def __call__(self, h: torch.Tensor, lora: LoraBatch | None, index: int) -> torch.Tensor:
        logits = functional.linear(h, self.router_weight, self.router_bias)
        weights, chosen = self._route(logits)
        return self._experts(h, chosen, weights)

    def _route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's expert weights and experts, ``[tokens, top_k]`` each."""
        if self.rule is Router.TOPK_SOFTMAX:
            top, chosen = torch.topk(logits, self.top_k, dim=-1)
            return torch.softmax(top, dim=1, dtype=top.dtype), chosen
        probs = _softmax_rows(logits)
        top, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            top = top / top.sum(dim=-1, keepdim=True)
        return top, chosen

    def _experts(
        self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        flat = chosen.flatten()
        order = flat.argsort(stable=True)
        rows = order // self.top_k  # the token of each (token, expert) pair, by expert
        if self.packed is not None:
            out = self._run_packed(self.packed, x.index_select(0, rows), flat)
            return self._combine(x, out, rows, order, weights)
        # Counted by scatter, not bincount, whose output size needs a host sync on CUDA.
        counts = flat.new_zeros(self.num_experts).index_add_(0, flat, torch.ones_like(flat))
        offsets = counts.cumsum(0).to(torch.int32)
        experts = flat[order]
        gate_up = _plus(
            torch._grouped_mm(x[rows], self.gate_up, offs=offsets), self.gate_up_bias, experts
        )
        out = _plus(
            torch._grouped_mm(self._activate(gate_up), self.down, offs=offsets),
            self.down_bias,
            experts,
        )
        return self._combine(x, out, rows, order, weights)

    def _run_packed(
        self, packed: list[tuple[Projection, Projection]], pairs: torch.Tensor, flat: torch.Tensor
    ) -> torch.Tensor:
        """Each expert's projections on its rows of ``pairs`` (sorted by expert)."""
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        starts = accumulate(counts[:-1], initial=0)  # where each expert's rows begin
        spans = [(e, at, n) for e, (at, n) in enumerate(zip(starts, counts, strict=True)) if n]
        gate_up = torch.cat([packed[e][0](pairs.narrow(0, at, n)) for e, at, n in spans])
        hidden = self._activate(gate_up)
        return torch.cat([packed[e][1](hidden.narrow(0, at, n)) for e, at, n in spans])

    @staticmethod
    def _combine(
        x: torch.Tensor,
        out: torch.Tensor,
        rows: torch.Tensor,
        order: torch.Tensor,
        weights: torch.Tensor,
    ) -> torch.Tensor:
        """The experts' rows weighted and summed back into their tokens."""
        out = out.float() * weights.flatten().index_select(0, order)[:, None].float()
        return torch.zeros_like(x).index_add_(0, rows, out.to(x.dtype))

    def _activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.activation is ExpertActivation.CLAMPED_SWIGLU:
            # gpt-oss: gate and up interleaved, each clamped, and ``(up + 1) * swish``.
            gate = gate_up[..., ::2].clamp(max=self.limit)
            up = gate_up[..., 1::2].clamp(min=-self.limit, max=self.limit)
            return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
        assert self.act is not None
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act(gate) * up  # type: ignore[no-any-return]


def _softmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``softmax(logits, dim=-1)`` in float32 over ``[tokens, experts]``, taken over the
    transposed tensor's first dim on the CPU: the CPU kernel runs one row at a time
    along a short last dim (a handful of experts) and vectorizes across a long one
    (the tokens), for the same values within a float32 rounding."""
    logits = logits.float()
    if logits.device.type != "cpu":
        return torch.softmax(logits, dim=-1)
    return torch.softmax(logits.t(), dim=0).t()


def _in_out(weight: torch.Tensor, transposed: bool) -> torch.Tensor:
    """An experts' weight as ``[experts, in, out]``: a view, never a copy."""
    weight = weight.detach()
    return weight if transposed else weight.transpose(1, 2)


def _packed_experts(
    gate_up: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down: torch.Tensor,
    down_bias: torch.Tensor | None,
) -> list[tuple[Projection, Projection]] | None:
    """Each expert's two projections with their weights reordered for oneDNN, where
    dense projections are (fp32 on the CPU); None elsewhere."""
    experts = [
        (
            Projection(gate_up[e].t(), None if gate_up_bias is None else gate_up_bias[e]),
            Projection(down[e].t(), None if down_bias is None else down_bias[e]),
        )
        for e in range(gate_up.shape[0])
    ]
    return experts if all(p.packed is not None for pair in experts for p in pair) else None


def _optional(module: Any, name: str) -> torch.Tensor | None:
    value = getattr(module, name, None)
    return None if value is None else value.detach()


def _plus(x: torch.Tensor, bias: torch.Tensor | None, experts: torch.Tensor) -> torch.Tensor:
    """``x`` plus each row's expert's bias."""
    return x if bias is None else x + bias[experts]
