"""The fused forward of every described family: one flat step of tokens in, the
sampling rows' logits and the pooling rows' final hidden states out.

It is built from a loaded transformers causal LM and its :class:`Family`, and uses
that model's own parameters (fused projections are views of the same memory). The
attention backend, the step's LoRA adapters and each token's rope length come in
the :class:`ForwardBatch`; nothing here names a family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional

from worker.engine.attention import AttentionSpec, AttentionStep
from worker.engine.lora import LoraBatch, apply_lora
from worker.engine.models.family import Family, QKNorm
from worker.engine.models.layers import (
    GatedMLP,
    Projection,
    QKNormPerHead,
    RMSNorm,
    fused_projection,
)
from worker.engine.models.moe import SparseMoe
from worker.engine.models.rotary import Rope, Rotary, rotate


@dataclass
class ForwardBatch:
    """A step on the device: token ids and positions ``[tokens]``; which rows' logits
    (``logits_index``) and final hidden states (``pool_index``) to return."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    logits_index: torch.Tensor
    attention: AttentionStep
    pool_index: torch.Tensor | None = None
    rope_lens: list[int] | None = None
    lora: LoraBatch | None = None


class Attention:
    """Fused q/k/v (optional bias), optional q/k norm, rotary, attention, output."""

    def __init__(
        self, family: Family, attn: Any, config: Any, spec: AttentionSpec, rope: str | None
    ):
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(attn, "head_dim", None) or config.hidden_size // self.num_heads)
        self.qkv = fused_projection(attn, family.qkv)
        self.o = Projection.of(attn.o_proj)
        self.spec, self.rope = spec, rope
        offset = family.norm_offset
        self.per_head = (
            QKNormPerHead(attn.q_norm, attn.k_norm, self.num_heads, self.num_kv_heads, offset)
            if family.qk_norm is QKNorm.PER_HEAD
            else None
        )
        self.whole = (
            (RMSNorm(attn.q_norm, offset), RMSNorm(attn.k_norm, offset))
            if family.qk_norm is QKNorm.WHOLE
            else None
        )

    def __call__(
        self, index: int, h: torch.Tensor, ropes: dict[str, Rope], batch: ForwardBatch
    ) -> torch.Tensor:
        num_tokens = h.shape[0]
        qkv = apply_lora(batch.lora, index, "qkv", h, self.qkv(h))
        qk = self._queries_keys(qkv)
        if self.rope is not None:
            # Queries and keys lie side by side: one rotation for both.
            qk = rotate(qk, ropes[self.rope])
        q, k = torch.split(qk, [self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, (self.num_heads + self.num_kv_heads) * self.head_dim :]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        attn = batch.attention.attend(index, q, k, v, self.spec).reshape(num_tokens, -1)
        return apply_lora(batch.lora, index, "o", attn, self.o(attn))

    def _queries_keys(self, qkv: torch.Tensor) -> torch.Tensor:
        """``[tokens, heads + kv_heads, head_dim]``, q/k-normed where the family is."""
        q_width = self.num_heads * self.head_dim
        qk_width = q_width + self.num_kv_heads * self.head_dim
        shape = (qkv.shape[0], self.num_heads + self.num_kv_heads, self.head_dim)
        if self.whole is not None:
            q_norm, k_norm = self.whole
            q, k = q_norm(qkv[:, :q_width]), k_norm(qkv[:, q_width:qk_width])
            return torch.cat([q, k], dim=1).view(shape)
        qk = qkv[:, :qk_width].view(shape)
        return qk if self.per_head is None else self.per_head(qk)


class DecoderLayer:
    def __init__(
        self, family: Family, layer: Any, config: Any, spec: AttentionSpec, rope: str | None
    ) -> None:
        norms = family.norms

        def norm(name: str | None) -> RMSNorm | None:
            return None if name is None else RMSNorm(getattr(layer, name), family.norm_offset)

        self.before_attn, self.after_attn = norm(norms.before_attn), norm(norms.after_attn)
        self.before_mlp, self.after_mlp = norm(norms.before_mlp), norm(norms.after_mlp)
        self.attention = Attention(family, layer.self_attn, config, spec, rope)
        self.mlp = _mlp(family, layer.mlp, config)
        self.residual_scale = family.float_option(config, family.residual_scale)

    def __call__(
        self, index: int, x: torch.Tensor, ropes: dict[str, Rope], batch: ForwardBatch
    ) -> torch.Tensor:
        h = x if self.before_attn is None else self.before_attn(x)
        h = self.attention(index, h, ropes, batch)
        x = self._residual(x, h if self.after_attn is None else self.after_attn(h))
        h = x if self.before_mlp is None else self.before_mlp(x)
        h = self.mlp(h, batch.lora, index)
        return self._residual(x, h if self.after_mlp is None else self.after_mlp(h))

    def _residual(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return x + (h if self.residual_scale is None else h * self.residual_scale)


def _mlp(family: Family, mlp: Any, config: Any) -> GatedMLP | SparseMoe:
    """The layer's MLP: sparse where it has experts (a MoE model's dense layers stay dense)."""
    if family.moe is not None and hasattr(mlp, "experts"):
        return SparseMoe(mlp, family.moe, config)
    return GatedMLP(mlp, family.gate_up)


class DecoderModel:
    """The fused forward of a causal LM of a described family (see the module docs)."""

    def __init__(self, model: Any, family: Family) -> None:
        config = model.config.get_text_config()
        inner = model.get_decoder()
        self.family = family
        self.specs = attention_specs(model, family)
        rope_sets = family.rope_sets(config)
        self.layers = [
            DecoderLayer(family, layer, config, spec, rope)
            for layer, spec, rope in zip(inner.layers, self.specs, rope_sets, strict=True)
        ]
        self.rotary = Rotary(inner.rotary_emb, config, {r for r in rope_sets if r is not None})
        self.embed_weight: torch.Tensor = inner.embed_tokens.weight
        scale = family.embed_scale(config)
        dtype = self.embed_weight.dtype
        device = self.embed_weight.device  # made here: a CUDA graph cannot copy it in
        self.embed_scale = None if scale == 1.0 else torch.tensor(scale, dtype=dtype, device=device)
        self.norm = RMSNorm(inner.norm, family.norm_offset)
        self.lm_head = Projection.of(model.get_output_embeddings())
        self.logit_divisor = family.float_option(config, family.logit_divisor)
        self.final_softcap = family.float_option(config, family.final_softcap)

    def __call__(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[len(logits_index), vocab]`` and the final (normed) hidden states
        of the ``pool_index`` rows."""
        x = functional.embedding(batch.input_ids, self.embed_weight)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        ropes = self.rotary(batch.positions, batch.rope_lens, x.dtype)
        for index, layer in enumerate(self.layers):
            x = layer(index, x, ropes, batch)
        logits = self._logits(self.norm(x[batch.logits_index]))
        pooled = None if batch.pool_index is None else self.norm(x[batch.pool_index])
        return logits, pooled

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(h)
        if self.logit_divisor is not None:
            logits = logits / self.logit_divisor
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


def attention_specs(model: Any, family: Family) -> list[AttentionSpec]:
    """Each layer's attention: the scale its module uses, the family's window,
    soft-cap and sinks."""
    config = model.config.get_text_config()
    softcap = family.float_option(config, family.attn_softcap)
    specs = []
    for layer, window in zip(model.get_decoder().layers, family.windows(config), strict=True):
        attn = layer.self_attn
        sinks = attn.sinks.detach().float() if family.sinks else None
        specs.append(AttentionSpec(float(attn.scaling), window, softcap, sinks))
    return specs
