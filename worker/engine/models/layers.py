"""Shared parts of the fused forward: projections, RMSNorm, q/k norms, the gated MLP.

On the CPU a step's cost is the linear layers, and small ones (a 576-wide model's
key and value projections) run far below the machine's peak. Fusing q/k/v into
one matmul and gate/up into another makes each step cheaper; the original
parameters become views of the fused ones, so transformers' own forward (the
self-check's reference) keeps working on the same memory.

On the CPU every projection and the LM head run through oneDNN with the weight
reordered once into its blocked layout (:class:`Projection`), rather than through
``functional.linear`` (MKL's sgemm): the blocked layout suits the small, skinny
matmuls of a step at every batch size the engine runs (``bench/engine.py``), at the
cost of one more copy of the projection weights in host memory.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch.nn import functional

from worker.engine.lora import LoraBatch, apply_lora


class Projection:
    """A linear layer (optional bias): through oneDNN with the weight reordered once
    for fp32 on the CPU (see the module docs), ``functional.linear`` elsewhere."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.packed: torch.Tensor | None = None
        on_cpu = weight.device.type == "cpu" and weight.dtype == torch.float32
        mkldnn = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        if on_cpu and mkldnn and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
            with torch.inference_mode():
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight)

    @classmethod
    def of(cls, linear: Any) -> Projection:
        return cls(linear.weight, linear.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return functional.linear(x, self.weight, self.bias)
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self.packed, self.bias, "none", [], ""
        )
        return out


def fused_projection(module: Any, names: tuple[str, ...]) -> Projection:
    """One projection for the linear layers ``names`` of ``module``, which read the same
    input; each original weight (and bias) becomes a view into the fused one."""
    linears = [getattr(module, name) for name in names]
    if len(linears) == 1:
        return Projection.of(linears[0])
    weight = _fuse([linear.weight for linear in linears])
    for linear, part in zip(linears, _split(weight, linears), strict=True):
        linear.weight = torch.nn.Parameter(part, requires_grad=False)
    if all(linear.bias is None for linear in linears):
        return Projection(weight)
    bias = _fuse([_bias_of(linear) for linear in linears])
    for linear, part in zip(
        linears, torch.split(bias, [lin.out_features for lin in linears]), strict=True
    ):
        linear.bias = torch.nn.Parameter(part, requires_grad=False)
    return Projection(weight, bias)


def _fuse(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach() for t in tensors], dim=0)


def _split(weight: torch.Tensor, linears: list[Any]) -> tuple[torch.Tensor, ...]:
    return torch.split(weight, [int(linear.weight.shape[0]) for linear in linears])


def _bias_of(linear: Any) -> torch.Tensor:
    if linear.bias is not None:
        return cast(torch.Tensor, linear.bias)
    return cast(torch.Tensor, linear.weight.new_zeros(linear.weight.shape[0]))


class RMSNorm:
    """transformers' RMSNorm, scaling by ``offset + weight``; in fp32 as torch's one
    fused op (the same values, one pass instead of five: on the CPU each op is a
    parallel region of its own), in other dtypes through the module itself, whose
    casts each family places its own way."""

    def __init__(self, module: Any, offset: float = 0.0) -> None:
        self.module = module
        self.eps = float(getattr(module, "variance_epsilon", None) or module.eps)
        weight = module.weight.detach()
        self.weight = weight.float() + offset if offset else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            return cast(torch.Tensor, self.module(x))
        return functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class QKNormPerHead:
    """Per-head RMSNorms of queries and keys (Qwen3, Gemma 3), applied to both at once
    where they lie side by side: ``[tokens, heads + kv_heads, head_dim]``."""

    def __init__(self, q_norm: Any, k_norm: Any, num_heads: int, num_kv_heads: int, offset: float):
        self.q_norm, self.k_norm = RMSNorm(q_norm, offset), RMSNorm(k_norm, offset)
        self.num_heads = num_heads
        self.weight = torch.cat(
            [self.q_norm.weight.expand(num_heads, -1), self.k_norm.weight.expand(num_kv_heads, -1)]
        )

    def __call__(self, qk: torch.Tensor) -> torch.Tensor:
        if qk.dtype != torch.float32:
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
            return torch.cat([self.q_norm(q), self.k_norm(k)], dim=1)
        return functional.rms_norm(qk, (qk.shape[-1],), None, self.q_norm.eps) * self.weight


class GatedMLP:
    """``down(act(gate(x)) * up(x))`` with gate and up as one projection, and the
    LoRA sites ``gate_up`` and ``down``. The activation is the module's own (SiLU for
    a module that names none, as LFM2's hard-codes it)."""

    def __init__(self, mlp: Any, gate_up: tuple[str, ...], down: str = "down_proj") -> None:
        self.gate_up = fused_projection(mlp, gate_up)
        self.down = Projection.of(getattr(mlp, down))
        self.act = _activation(mlp)

    def __call__(self, h: torch.Tensor, lora: LoraBatch | None, index: int) -> torch.Tensor:
        gate_up = apply_lora(lora, index, "gate_up", h, self.gate_up(h))
        gate, up = gate_up.chunk(2, dim=-1)
        h = self.act(gate) * up
        return apply_lora(lora, index, "down", h, self.down(h))


def _activation(mlp: Any) -> Any:
    for name in ("act_fn", "activation_fn", "activation"):
        act = getattr(mlp, name, None)
        if callable(act):
            return act
    return functional.silu
