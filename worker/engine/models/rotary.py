"""Rotary position embeddings of every kind transformers configures.

The frequencies are transformers' own: the model's rotary module's buffers, computed
by ``ROPE_INIT_FUNCTIONS`` for its ``rope_type`` (default, linear, llama3, yarn,
longrope, dynamic...) with their attention scaling. Models with a set of rope
parameters per layer type (Gemma 3, OLMo 3) have one :class:`RopeSet` per type.

Two kinds change with the sequence's length, which transformers' ``generate`` sees
as the longest position of a forward call: ``longrope`` switches to its long factors
and ``dynamic`` rescales its base once that passes the original context. For one
request alone that is its prompt's length while prefilling and the token's own
length after, so each token here rotates for ``max(prompt length, position + 1)``
(its *rope length*): the same frequencies ``generate`` on that request alone would
use, whatever else shares the step and however the prompt is chunked. Phi-3's
``generate`` recomputes a sequence whole when it first grows past the switch; with
``whole_sequence`` every token rotates for its sequence's length, and the scheduler
recomputes a sequence at the switch. A token's rotation then depends on more than its
prefix, so such models serve without the prefix cache.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

Rope = tuple[torch.Tensor, torch.Tensor]  # cos and sin, [tokens, 1, rotary_dim]
LENGTH_DEPENDENT = frozenset({"dynamic", "longrope"})


class RopeSet:
    """One set of rope parameters: ``key`` is the layer type, "" for a model's only set."""

    def __init__(self, module: Any, config: Any, key: str) -> None:
        prefix = f"{key}_" if key else ""
        rope_type = module.rope_type[key] if key else module.rope_type
        self.rope_type = str(rope_type)
        self.key = key
        self.config = config
        self.inv_freq: torch.Tensor = getattr(module, f"{prefix}original_inv_freq").float()
        self.scaling = float(getattr(module, f"{prefix}attention_scaling"))
        params = config.rope_parameters[key] if key else config.rope_parameters
        # Where the length-dependent kinds switch (see the module docs).
        self.original_len = int(
            params.get("original_max_position_embeddings", config.max_position_embeddings)
            if self.rope_type == "longrope"
            else config.max_position_embeddings
        )

    @property
    def length_dependent(self) -> bool:
        return any(kind in self.rope_type for kind in LENGTH_DEPENDENT)

    def __call__(
        self, positions: torch.Tensor, rope_lens: list[int] | None, dtype: torch.dtype
    ) -> Rope:
        inv_freq = self.inv_freq.to(positions.device)
        if self.length_dependent and rope_lens is not None:
            inv_freq = self._per_token(inv_freq, rope_lens)
        freqs = positions[:, None].float() * inv_freq  # [tokens, rotary_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return (emb.cos() * self.scaling).to(dtype), (emb.sin() * self.scaling).to(dtype)

    def _per_token(self, inv_freq: torch.Tensor, rope_lens: list[int]) -> torch.Tensor:
        """``[tokens, rotary_dim / 2]``: each token's frequencies for its rope length."""
        longer = sorted({n for n in rope_lens if n > self.original_len})
        if not longer:
            return inv_freq
        rows = inv_freq.expand(len(rope_lens), -1).clone()
        lens = torch.tensor(rope_lens, device=inv_freq.device)
        if "dynamic" not in self.rope_type:  # longrope: one set of long factors past the switch
            rows[lens > self.original_len] = self._frequencies(longer[0], inv_freq.device)
            return rows
        for length in longer:
            rows[lens == length] = self._frequencies(length, inv_freq.device)
        return rows

    def _frequencies(self, seq_len: int, device: torch.device) -> torch.Tensor:
        init = ROPE_INIT_FUNCTIONS[self.rope_type]
        kwargs = {"layer_type": self.key} if self.key else {}
        inv_freq, _ = init(self.config, device, seq_len=seq_len, **kwargs)
        return inv_freq.float()


class Rotary:
    """Every rope set the model's layers use; a step's cos and sin per set."""

    def __init__(self, module: Any, config: Any, keys: set[str]) -> None:
        self.sets = {key: RopeSet(module, config, key) for key in sorted(keys)}

    def switch_len(self, max_model_len: int) -> int | None:
        """The sequence length past which a length-dependent set changes, where a
        sequence may grow past it (None: the rotation depends on positions only)."""
        lens = [s.original_len for s in self.sets.values() if s.length_dependent]
        return min(lens) if lens and min(lens) < max_model_len else None

    def base_only(self, rope_lens: list[int] | None) -> bool:
        """Whether every token rotates with the base frequencies (a captured graph's)."""
        if rope_lens is None or not rope_lens:
            return True
        longest = max(rope_lens)
        return all(longest <= s.original_len for s in self.sets.values() if s.length_dependent)

    def __call__(
        self, positions: torch.Tensor, rope_lens: list[int] | None, dtype: torch.dtype
    ) -> dict[str, Rope]:
        return {key: rope(positions, rope_lens, dtype) for key, rope in self.sets.items()}


def rotate(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """``x`` ``[tokens, heads, head_dim]`` rotated on its first ``rotary_dim``
    dimensions (all of them but for partial rotary, as Phi-3 may have)."""
    cos, sin = rope
    dim = cos.shape[-1]
    if dim < x.shape[-1]:
        return torch.cat((rotate(x[..., :dim], rope), x[..., dim:]), dim=-1)
    half = dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
