"""A sparse MoE MLP beside a shared expert every token takes (Qwen3-Next, Granite
4.0-H): the experts' output plus the shared expert's, which Qwen3-Next scales by a
sigmoid gate of its own per token."""

from __future__ import annotations

import torch

from worker.engine.lora import LoraBatch
from worker.engine.models.layers import GatedMLP, Projection
from worker.engine.models.moe import SparseMoe


class SharedExpertMoe:
    def __init__(self, sparse: SparseMoe, shared: GatedMLP, gate: Projection | None) -> None:
        self.sparse, self.shared, self.gate = sparse, shared, gate

    def __call__(self, h: torch.Tensor, lora: LoraBatch | None, index: int) -> torch.Tensor:
        shared = self.shared(h, lora, index)
        if self.gate is not None:
            shared = torch.sigmoid(self.gate(h)) * shared
        return self.sparse(h, lora, index) + shared
