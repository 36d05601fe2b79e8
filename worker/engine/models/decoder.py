"""The fused forward of every described family: one flat step of tokens in, the
sampling rows' logits and the pooling rows' final hidden states out.

It is built from a loaded transformers causal LM and its :class:`Family`, and uses
that model's own parameters (fused projections are views of the same memory). The
attention backend, a hybrid's state rows (``worker.engine.models.state``), the
step's LoRA adapters and each token's rope length come in the :class:`ForwardBatch`;
nothing here names a family. A layer mixes tokens either by attention (over the paged
KV cache: the model's attention layers hold one pool each, in order) or, on a
hybrid's other layers, by the family's state layer (one state pool each, in order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

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
from worker.engine.models.shared_expert import SharedExpertMoe
from worker.engine.models.state import StateMixer, StateStep


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
    state: StateStep | None = None


class Attention:
    """Fused q/k/v (optional bias), optional q/k norm, rotary, attention, an optional
    output gate, output projection. ``cache_index`` is its KV pool."""

    def __init__(
        self,
        family: Family,
        attn: Any,
        config: Any,
        spec: AttentionSpec,
        rope: str | None,
        cache_index: int,
    ):
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(attn, "head_dim", None) or config.hidden_size // self.num_heads)
        self.qkv = fused_projection(attn, family.qkv)
        self.o = Projection.of(getattr(attn, family.attn_out))
        self.spec, self.rope, self.cache_index = spec, rope, cache_index
        self.gated = family.attn_gate
        offset = family.norm_offset
        q_norm, k_norm = (getattr(attn, name, None) for name in family.qk_norms)
        self.per_head = (
            QKNormPerHead(q_norm, k_norm, self.num_heads, self.num_kv_heads, offset)
            if family.qk_norm is QKNorm.PER_HEAD
            else None
        )
        self.whole = (
            (RMSNorm(q_norm, offset), RMSNorm(k_norm, offset))
            if family.qk_norm is QKNorm.WHOLE
            else None
        )

    def __call__(
        self, index: int, h: torch.Tensor, ropes: dict[str, Rope], batch: ForwardBatch
    ) -> torch.Tensor:
        num_tokens = h.shape[0]
        qkv = apply_lora(batch.lora, index, "qkv", h, self.qkv(h))
        gate = None
        if self.gated:  # each head's query, then its gate
            per_head = qkv[:, : 2 * self.num_heads * self.head_dim]
            q, gate = per_head.view(num_tokens, self.num_heads, 2, self.head_dim).unbind(2)
            qkv = torch.cat([q.reshape(num_tokens, -1), qkv[:, per_head.shape[1] :]], dim=1)
        qk = self._queries_keys(qkv)
        if self.rope is not None:
            # Queries and keys lie side by side: one rotation for both.
            qk = rotate(qk, ropes[self.rope])
        q, k = torch.split(qk, [self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, (self.num_heads + self.num_kv_heads) * self.head_dim :]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        attn = batch.attention.attend(self.cache_index, q, k, v, self.spec)
        attn = attn.reshape(num_tokens, -1)
        if gate is not None:
            attn = attn * torch.sigmoid(gate.reshape(num_tokens, -1))
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


class LayerRunner(Protocol):
    """Runs the layers of the steps it takes in place of the loop below: the layers
    compiled for small steps (``worker.engine.compiled``)."""

    def takes(self, num_tokens: int, batch: ForwardBatch) -> bool: ...

    def __call__(
        self, x: torch.Tensor, ropes: dict[str, Rope], batch: ForwardBatch
    ) -> torch.Tensor: ...


Mixer = Attention | StateMixer
Mlp = GatedMLP | SparseMoe | SharedExpertMoe


class DecoderLayer:
    def __init__(self, family: Family, layer: Any, config: Any, mixer: Mixer) -> None:
        norms = family.norms

        def norm(name: str | None) -> RMSNorm | None:
            return None if name is None else RMSNorm(getattr(layer, name), family.norm_offset)

        self.before_attn, self.after_attn = norm(norms.before_attn), norm(norms.after_attn)
        self.before_mlp, self.after_mlp = norm(norms.before_mlp), norm(norms.after_mlp)
        self.mixer = mixer
        self.mlp = _mlp(family, layer, config)
        self.residual_scale = family.float_option(config, family.residual_scale)

    def __call__(
        self, index: int, x: torch.Tensor, ropes: dict[str, Rope], batch: ForwardBatch
    ) -> torch.Tensor:
        h = x if self.before_attn is None else self.before_attn(x)
        h = self.mixer(index, h, ropes, batch)
        x = self._residual(x, h if self.after_attn is None else self.after_attn(h))
        h = x if self.before_mlp is None else self.before_mlp(x)
        h = self.mlp(h, batch.lora, index)
        return self._residual(x, h if self.after_mlp is None else self.after_mlp(h))

    def _residual(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return x + (h if self.residual_scale is None else h * self.residual_scale)


def _mlp(family: Family, layer: Any, config: Any) -> Mlp:
    """The layer's MLP: sparse where it has experts (a MoE model's dense layers stay
    dense), beside its shared expert where the family has one."""
    module, moe = getattr(layer, family.mlp, None), family.moe
    if moe is None or module is None or not hasattr(module, "experts"):
        dense = module if module is not None or moe is None else _path(layer, moe.shared)
        return GatedMLP(dense, family.gate_up, family.down)
    sparse = SparseMoe(module, moe, config)
    if moe.shared is None:
        return sparse
    shared = GatedMLP(_path(layer, moe.shared), family.gate_up, family.down)
    gate = None if moe.shared_gate is None else Projection.of(_path(layer, moe.shared_gate))
    return SharedExpertMoe(sparse, shared, gate)


def _path(module: Any, path: str | None) -> Any:
    if path is None:
        raise ValueError("a dense MLP is missing from the family's description")
    for name in path.split("."):
        module = getattr(module, name)
    return module


class DecoderModel:
    """The fused forward of a causal LM of a described family (see the module docs)."""

    def __init__(self, model: Any, family: Family) -> None:
        config = model.config.get_text_config()
        inner = model.get_decoder()
        self.family = family
        self.attention_layers = [i for i, layer in enumerate(inner.layers) if _attends(layer)]
        self.specs = attention_specs(model, family)
        specs = dict(zip(self.attention_layers, self.specs, strict=True))
        rope_sets = family.rope_sets(config)
        self.state_mixers: list[StateMixer] = []
        self.layers = [
            DecoderLayer(family, layer, config, self._mixer(i, layer, config, specs, rope_sets[i]))
            for i, layer in enumerate(inner.layers)
        ]
        used = {rope_sets[i] for i in self.attention_layers}
        self.rotary = Rotary(inner.rotary_emb, config, {r for r in used if r is not None})
        self.embed_weight: torch.Tensor = inner.embed_tokens.weight
        scale = family.embed_scale(config)
        dtype = self.embed_weight.dtype
        device = self.embed_weight.device  # made here: a CUDA graph cannot copy it in
        self.embed_scale = None if scale == 1.0 else torch.tensor(scale, dtype=dtype, device=device)
        self.norm = RMSNorm(getattr(inner, family.final_norm), family.norm_offset)
        self.lm_head = Projection.of(model.get_output_embeddings())
        self.logit_divisor = family.float_option(config, family.logit_divisor)
        self.final_softcap = family.float_option(config, family.final_softcap)
        self.compiled: LayerRunner | None = None  # set by the runner for ``--compile``

    def _mixer(
        self,
        index: int,
        layer: Any,
        config: Any,
        specs: dict[int, AttentionSpec],
        rope: str | None,
    ) -> Mixer:
        if index in specs:
            cache_index = self.attention_layers.index(index)
            return Attention(self.family, layer.self_attn, config, specs[index], rope, cache_index)
        if self.family.state is None:
            raise ValueError(f"layer {index} neither attends nor is a described state layer")
        mixer: StateMixer = self.family.state.build(
            getattr(layer, self.family.state.attribute), config
        )
        mixer.state_index = len(self.state_mixers)
        self.state_mixers.append(mixer)
        return mixer

    def __call__(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[len(logits_index), vocab]`` and the final (normed) hidden states
        of the ``pool_index`` rows."""
        x = functional.embedding(batch.input_ids, self.embed_weight)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        ropes = self.rotary(batch.positions, batch.rope_lens, x.dtype)
        if self.compiled is not None and self.compiled.takes(x.shape[0], batch):
            x = self.compiled(x, ropes, batch)
        else:
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


def _attends(layer: Any) -> bool:
    return getattr(layer, "self_attn", None) is not None


def attention_specs(model: Any, family: Family) -> list[AttentionSpec]:
    """Each attention layer's attention, in order: the scale its module uses, the
    family's window, soft-cap and sinks."""
    config = model.config.get_text_config()
    softcap = family.float_option(config, family.attn_softcap)
    specs = []
    for layer, window in zip(model.get_decoder().layers, family.windows(config), strict=True):
        if not _attends(layer):
            continue
        attn = layer.self_attn
        sinks = attn.sinks.detach().float() if family.sinks else None
        specs.append(AttentionSpec(float(attn.scaling), window, softcap, sinks))
    return specs
