"""A model family as data: what a decoder layer is made of and where its options live.

The fused forward (:mod:`worker.engine.models.decoder`) is the same for every family;
a :class:`Family` says which of its shared parts a family uses and reads the family's
options from its transformers config. Anything a description cannot say is either
refused (``unsupported``) or caught by the start-up self-check.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Config = Any  # a transformers text config


@dataclass(frozen=True)
class Norms:
    """The decoder layer's RMSNorms by attribute name, around attention and MLP (None:
    not there). Llama normalises before each; Gemma before and after; OLMo 2 after."""

    before_attn: str | None = "input_layernorm"
    after_attn: str | None = None
    before_mlp: str | None = "post_attention_layernorm"
    after_mlp: str | None = None


PRE_NORM = Norms()
SANDWICH_NORM = Norms(
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)
POST_NORM = Norms(None, "post_attention_layernorm", None, "post_feedforward_layernorm")


class QKNorm(enum.Enum):
    NONE = "none"
    PER_HEAD = "per_head"  # Qwen3, Gemma 3: an RMSNorm over each head's dimensions
    WHOLE = "whole"  # OLMo 2 and 3: one RMSNorm over all heads of q (and of k)


class Router(enum.Enum):
    SOFTMAX_TOPK = "softmax_topk"  # softmax over every expert, then the top k
    TOPK_SOFTMAX = "topk_softmax"  # the top k logits, then a softmax over them (gpt-oss)


class ExpertActivation(enum.Enum):
    GATED = "gated"  # act(gate) * up, gate and up as halves
    CLAMPED_SWIGLU = "clamped_swiglu"  # gpt-oss: clamped, interleaved, (up + 1) * gate * sigmoid


def no_windows(config: Config) -> list[int | None]:
    return [None] * config.num_hidden_layers


def every_layer_window(config: Config) -> list[int | None]:
    """One window for every layer, where ``sliding_window`` is set (Mistral, Mixtral)."""
    return [config.sliding_window] * config.num_hidden_layers


def layer_type_windows(config: Config) -> list[int | None]:
    """The window on the layers ``layer_types`` marks sliding (Qwen2, Gemma, gpt-oss)."""
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    return [window if kind == "sliding_attention" else None for kind in types]


def one_rope(config: Config) -> list[str | None]:
    """Every layer rotates with the model's one set of rope parameters ("")."""
    return [""] * config.num_hidden_layers


def rope_per_layer_type(config: Config) -> list[str | None]:
    """Each layer rotates with its layer type's rope parameters (Gemma 3, OLMo 3)."""
    return list(config.layer_types)


def bidirectional(config: Config) -> str | None:
    if getattr(config, "use_bidirectional_attention", False):
        return "bidirectional attention (an embedding model, not a causal LM)"
    return None


def always(config: Config) -> bool:
    return True


def unit_scale(config: Config) -> float:
    return 1.0


def nothing_unsupported(config: Config) -> str | None:
    return None


@dataclass(frozen=True)
class Moe:
    """A sparse MLP: the router's submodule and rule, the experts' weight layout.

    Experts hold ``gate_up_proj`` and ``down_proj`` as ``[experts, out, in]`` or, with
    ``transposed``, ``[experts, in, out]``; biases (``*_bias``) where the module has them.
    A shared expert (a dense gated MLP every token takes, dotted path from the decoder
    layer) adds to the experts' output, scaled by ``sigmoid(shared_gate(x))`` where the
    family has that gate (Qwen3-Next).
    """

    router: str = "gate"
    rule: Router = Router.SOFTMAX_TOPK
    renormalize: Callable[[Config], bool] = always
    transposed: bool = False
    activation: ExpertActivation = ExpertActivation.GATED
    shared: str | None = None
    shared_gate: str | None = None


@dataclass(frozen=True)
class StateLayer:
    """A hybrid's layers that keep a state per sequence instead of attending: their
    type in the config's ``layer_types``, the decoder layer's module (``attribute``)
    on them, and ``build``, which makes the fused mixer from that module and the
    config (``worker.engine.models.state``)."""

    layer_type: str
    attribute: str
    build: Callable[[Any, Config], Any]


@dataclass(frozen=True)
class Family:
    """One family's description (see the module docs). Scalars default to "not used"."""

    name: str
    model_types: tuple[str, ...]
    norms: Norms = PRE_NORM
    norm_offset: float = 0.0  # RMSNorm scales by ``offset + weight`` (Gemma: 1)
    qk_norm: QKNorm = QKNorm.NONE
    qk_norms: tuple[str, str] = ("q_norm", "k_norm")
    qkv: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
    attn_out: str = "o_proj"
    # Queries come with a gate per head (q_proj gives each head's query, then its gate):
    # the attention output is scaled by ``sigmoid(gate)`` before ``attn_out`` (Qwen3.5).
    attn_gate: bool = False
    mlp: str = "mlp"  # the decoder layer's MLP (a sparse one, on MoE layers)
    gate_up: tuple[str, ...] = ("gate_proj", "up_proj")
    down: str = "down_proj"
    final_norm: str = "norm"
    windows: Callable[[Config], list[int | None]] = no_windows
    rope_sets: Callable[[Config], list[str | None]] = one_rope
    attn_softcap: str | None = None  # the config attribute, where the family uses one
    final_softcap: str | None = None
    embed_scale: Callable[[Config], float] = unit_scale
    residual_scale: str | None = None
    logit_divisor: str | None = None
    sinks: bool = False  # per-head attention sinks (``self_attn.sinks``)
    # A length-dependent rotary (longrope) switching recomputes every token before it,
    # as Phi-3's ``generate`` does; else tokens keep the rotation they were computed with.
    recompute_on_rope_switch: bool = False
    moe: Moe | None = None
    state: StateLayer | None = None  # a hybrid's recurrent or convolution layers
    unsupported: Callable[[Config], str | None] = nothing_unsupported

    def float_option(self, config: Config, name: str | None) -> float | None:
        """A scalar option from the config (None where the family or config has none)."""
        value = None if name is None else getattr(config, name, None)
        return None if value is None else float(value)
