"""The fallback forward: transformers' own, with tokenq's attention plugged in.

For a causal LM whose family has no description in ``worker.engine.models``: the
step's flat batch goes through the model's forward as one sequence with explicit
positions, and each layer's attention goes through :func:`worker.engine.attention.
tokenq_attention` (the same backends as the fused forward). It is slower (no fused
projections, no CUDA graphs, no LoRA) and serves only a model that passes the
start-up self-check, which is what catches a model that does not route its
attention through transformers' attention interface.
"""

from __future__ import annotations

from typing import Any

import torch

from worker.engine.attention import ATTN_IMPLEMENTATION
from worker.engine.models.decoder import ForwardBatch


class GenericForward:
    def __init__(self, model: Any) -> None:
        self.model = model
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
        self._last_hidden: list[torch.Tensor] = []
        decoder = model.get_decoder()
        if decoder is not model:
            decoder.register_forward_hook(self._keep_hidden)

    def __call__(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits of the sampling rows; final hidden states of the pooling rows."""
        result = self.model(
            input_ids=batch.input_ids.unsqueeze(0),
            position_ids=batch.positions.unsqueeze(0),
            logits_to_keep=batch.logits_index,
            use_cache=False,
            tokenq_step=batch.attention,
        )
        logits: torch.Tensor = result.logits[0]
        hidden = self._last_hidden.pop() if self._last_hidden else None
        if batch.pool_index is None or hidden is None:
            return logits, None
        return logits, hidden[batch.pool_index]

    def _keep_hidden(self, module: Any, args: Any, output: Any) -> None:
        # The base model's (normed) last hidden state, which the causal LM's forward
        # does not return; kept for the pooling rows.
        self._last_hidden[:] = [output.last_hidden_state[0]]
