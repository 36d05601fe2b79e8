"""Attention over the engine's paged KV cache: one backend per device.

A step flattens every scheduled token into one sequence with explicit positions, so
the linear layers see one dense matrix; each layer then calls ``step.attend``, which
writes the new keys and values into the cache and attends each token to its own
sequence's context, under the layer's :class:`AttentionSpec` (scale, sliding window,
logit soft-cap, per-head sinks).

- On the CPU, :class:`CpuStep` (``worker.engine.cpu_attention``) gathers each decode
  row's context from its blocks into a few padded SDPAs (rows of similar length
  together) and runs each prefill chunk as its own SDPA; a sliding-window layer
  gathers only its window.
- On CUDA, :class:`PagedStep` runs one Triton kernel (``worker.engine.paged_attention``)
  that reads every token's context through its block table, decode rows and prefill
  chunks alike, so a whole step has fixed shapes and replays as a CUDA graph.

Blocks wholly outside every layer's window are not freed early: a model with full
attention layers beside its sliding ones (most of them) needs every block anyway,
and the prefix cache keys blocks by the whole prefix before them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import AttentionInterface

from worker.engine.paged_attention import paged_attention

ATTN_IMPLEMENTATION = "tokenq"


@dataclass(frozen=True)
class AttentionSpec:
    """How one layer attends: ``scale`` on the scores; a token sees the ``window``
    latest positions up to its own (None: all of them); scores are soft-capped as
    ``softcap * tanh(score / softcap)``; ``sinks`` (one logit per query head) join
    each softmax's denominator and take no value."""

    scale: float
    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None

    @property
    def plain(self) -> bool:
        """Whether SDPA computes it (it has no soft-cap and no sinks)."""
        return self.softcap is None and self.sinks is None


class AttentionStep(Protocol):
    """A step's attention metadata on one device's backend."""

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec
    ) -> torch.Tensor:
        """``q`` ``[tokens, heads, dim]``, ``k`` and ``v`` ``[tokens, kv_heads, dim]``;
        returns ``[tokens, heads, dim]``."""
        ...


@dataclass
class PagedStep:
    """A step's attention inputs for the paged kernel: each token's cache slot, its
    row of ``block_tables`` (int32 ``[rows, blocks]``) and position (-1: padding,
    which a captured graph's bucket adds and whose slot is a scratch one)."""

    key_cache: list[torch.Tensor]
    value_cache: list[torch.Tensor]
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    token_row: torch.Tensor
    token_pos: torch.Tensor
    block_size: int

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec
    ) -> torch.Tensor:
        k_cache, v_cache = write_kv(self.key_cache[layer], self.value_cache[layer], self, k, v)
        return paged_attention(
            q,
            k_cache,
            v_cache,
            self.block_tables,
            self.token_row,
            self.token_pos,
            spec.scale,
            self.block_size,
            window=spec.window or 0,
            softcap=spec.softcap or 0.0,
            sinks=spec.sinks,
        )


class _HasSlots(Protocol):
    slot_mapping: torch.Tensor


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, step: _HasSlots, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The new keys and values into their slots, before anything reads the cache: a
    chunk reading a block another row of this step writes sees its new contents."""
    k_cache.index_copy_(0, step.slot_mapping, k)
    v_cache.index_copy_(0, step.slot_mapping, v)
    return k_cache, v_cache


def tokenq_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    tokenq_step: AttentionStep | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The transformers attention interface, for models run through transformers' own
    forward (the fallback for families without a description): ``query`` is
    ``[1, heads, tokens, dim]``; returns ``[1, tokens, heads, dim]``. Options it
    does not know are refused rather than ignored."""
    if tokenq_step is None:
        raise RuntimeError("tokenq attention runs only inside the tokenq engine")
    spec = spec_from_kwargs(scaling or query.shape[-1] ** -0.5, kwargs)
    out = tokenq_step.attend(
        int(getattr(module, "layer_idx", 0)),
        query[0].transpose(0, 1),
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        spec,
    )
    return out.unsqueeze(0), None


# What transformers passes an attention function that changes nothing here.
IGNORED_KWARGS = frozenset(
    {
        "dropout",
        "position_ids",
        "cache_position",
        "is_causal",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "output_router_logits",
        "return_dict",
    }
)


def spec_from_kwargs(scale: float, kwargs: dict[str, Any]) -> AttentionSpec:
    """The spec transformers asks an attention function for; an option the engine
    cannot honour raises :class:`ValueError` naming it."""
    unknown = {k for k, v in kwargs.items() if v is not None and k not in IGNORED_KWARGS}
    unknown -= {"sliding_window", "softcap", "s_aux"}
    if unknown:
        raise ValueError(f"attention option(s) {', '.join(sorted(unknown))} not supported")
    sinks = kwargs.get("s_aux")
    return AttentionSpec(
        scale,
        kwargs.get("sliding_window"),
        kwargs.get("softcap"),
        None if sinks is None else sinks.detach().float(),
    )


AttentionInterface.register(ATTN_IMPLEMENTATION, tokenq_attention)
