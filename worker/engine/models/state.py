"""Layers that keep a state per sequence (hybrid models): the slots, and a step's rows.

Hybrid models interleave attention with layers that carry a fixed-size state from one
token to the next instead of attending to a growing context: Gated DeltaNet (Qwen3.5,
Qwen3-Next: a causal convolution's window and a recurrent matrix per head), short
convolutions (LFM2: a window) and Mamba-2 (Granite 4.0-H: a window and an SSM state
per head). Each running sequence holds one *state slot*: row ``slot`` of every such
layer's state tensors (:class:`StateCache`, allocated once, beside the KV blocks and
from the same budget).

A step's :class:`StateStep` says which slot each row reads and writes. Decode rows (one
token each) run together: their slots' states are gathered, advanced one token and
scattered back. Each multi-token (prefill) chunk runs alone, from its slot's state to
the state after its last token, so a prompt chunked over several steps carries its
state from chunk to chunk. A row at its sequence's first token starts from zeros,
whatever its slot held (``fresh``), so a slot freed by a finished or preempted
sequence is never read by the next one that takes it.

The recurrences themselves are transformers' (its torch code: chunked over a prefill
chunk, token by token for decode rows; or the CUDA kernels of fla, mamba_ssm and
causal-conv1d where those are installed, which transformers switches to). On CUDA a
decode-only step replays a captured graph (:meth:`StateStep.decode_only`): the rows'
slots and fresh flags are static buffers, and padding rows read and write a scratch
slot that no sequence holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.nn import functional
from transformers.activations import ACT2FN
from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_update

from worker.engine.step_inputs import StepInputs, on_device

log = logging.getLogger(__name__)

# Each state tensor of a layer, per slot: its shape and dtype.
StateShapes = list[tuple[tuple[int, ...], torch.dtype]]
# A layer's recurrence over rows: inputs ``[rows, tokens, ...]`` each and the rows'
# states ``[rows, ...]`` each, to outputs ``[rows, tokens, ...]`` and the new states.
RowFn = Callable[
    [tuple[torch.Tensor, ...], list[torch.Tensor]], tuple[torch.Tensor, list[torch.Tensor]]
]


class StateMixer(Protocol):
    """A hybrid's layer with state in place of attention, as the fused forward runs it."""

    state_index: int  # its place among the model's state layers (its pool)

    def state_shapes(self, dtype: torch.dtype) -> StateShapes: ...

    def __call__(self, index: int, h: torch.Tensor, ropes: Any, batch: Any) -> torch.Tensor: ...


@dataclass
class StateChunk:
    """A multi-token row: the step's tokens ``token_start:token_end``, its slot, and
    whether it starts its sequence (then from zeros)."""

    token_start: int
    token_end: int
    slot: int
    fresh: bool


@dataclass
class StateStep:
    """A step's state rows (see the module docs): ``pools[layer]`` are a state layer's
    tensors ``[slots, ...]``; the decode rows' slots, fresh flags (None: none is) and
    tokens (``decode_index``; None when the step is only decode rows, in order); the
    chunks."""

    pools: list[list[torch.Tensor]]
    decode_slots: torch.Tensor | None = None
    decode_fresh: torch.Tensor | None = None
    decode_index: torch.Tensor | None = None
    chunks: list[StateChunk] = field(default_factory=list)

    @classmethod
    def decode_only(
        cls, pools: list[list[torch.Tensor]], slots: torch.Tensor, fresh: torch.Tensor
    ) -> StateStep:
        """A step of one-token rows, token ``i`` being row ``i`` (a captured graph's)."""
        return cls(pools, slots, fresh)


def causal_conv(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """transformers' ``causal_conv1d_update``: the causal depthwise convolution of ``x``
    (``[rows, channels, tokens]``) after each row's window ``conv_state`` (its last
    ``kernel - 1`` inputs, advanced in place). On the CPU, one token a row (decode
    rows) is the weighted sum of each window instead of a convolution: the same sums,
    in another order, without a convolution's set-up for a window of a few inputs."""
    if x.shape[-1] != 1 or x.device.type != "cpu":
        return causal_conv1d_update(x, conv_state, weight, bias, activation)  # type: ignore[no-any-return]
    window = torch.cat([conv_state, x], dim=-1).to(weight.dtype)
    conv_state.copy_(window[:, :, 1:])
    out = torch.einsum("rck,ck->rc", window, weight)
    if bias is not None:
        out = out + bias
    if activation is not None:
        out = ACT2FN[activation](out)
    return out[:, :, None].to(x.dtype)


def gather_states(
    pool: list[torch.Tensor], slots: torch.Tensor, fresh: torch.Tensor | None
) -> list[torch.Tensor]:
    """The states of ``slots`` (copies), zeros for the rows starting their sequence
    (``fresh``; None: no row does)."""
    states = []
    for tensor in pool:
        state = tensor.index_select(0, slots)
        if fresh is not None:
            mask = fresh.view(-1, *([1] * (state.dim() - 1)))
            state = state.masked_fill(mask, 0)  # not a product: a stale NaN stays out
        states.append(state)
    return states


def scan_rows(step: StateStep, layer: int, xs: tuple[torch.Tensor, ...], fn: RowFn) -> torch.Tensor:
    """``fn`` over every row of the step with its slot's state, which it advances: the
    decode rows at once (``[rows, 1, ...]``), each chunk alone (``[1, tokens, ...]``).
    ``xs`` are per token (``[tokens, ...]``); returns the outputs per token."""
    pool = step.pools[layer]
    y: torch.Tensor | None = None
    if step.decode_slots is not None:
        index = step.decode_index
        rows = tuple(x[:, None] if index is None else x[index][:, None] for x in xs)
        out, states = fn(rows, gather_states(pool, step.decode_slots, step.decode_fresh))
        _scatter(pool, step.decode_slots, states)
        if index is None:  # only decode rows: token i is row i
            return out[:, 0]
        y = out.new_empty((xs[0].shape[0], *out.shape[2:]))
        y[index] = out[:, 0]
    for chunk in step.chunks:
        span = slice(chunk.token_start, chunk.token_end)
        states = [_chunk_state(tensor, chunk) for tensor in pool]
        out, states = fn(tuple(x[span][None] for x in xs), states)
        for tensor, state in zip(pool, states, strict=True):
            tensor[chunk.slot].copy_(state[0])
        if y is None:
            y = out.new_empty((xs[0].shape[0], *out.shape[2:]))
        y[span] = out[0]
    if y is None:
        raise RuntimeError("a step without rows")
    return y


def _chunk_state(tensor: torch.Tensor, chunk: StateChunk) -> torch.Tensor:
    if chunk.fresh:
        return tensor.new_zeros((1, *tensor.shape[1:]))
    return tensor[chunk.slot : chunk.slot + 1].clone()


def _scatter(pool: list[torch.Tensor], slots: torch.Tensor, states: list[torch.Tensor]) -> None:
    for tensor, state in zip(pool, states, strict=True):
        tensor.index_copy_(0, slots, state.to(tensor.dtype))


class StateCache:
    """Every state layer's tensors, ``num_slots`` slots and one scratch slot after them
    (where a captured graph's padding rows write), allocated once as zeros."""

    def __init__(self, shapes: Sequence[StateShapes], num_slots: int, device: torch.device) -> None:
        self.num_slots = num_slots
        self.scratch_slot = num_slots
        self.pools = [
            [
                torch.zeros((num_slots + 1, *shape), dtype=dtype, device=device)
                for shape, dtype in layer
            ]
            for layer in shapes
        ]
        self.device = device
        log.info(
            "state slots: %d sequences' recurrent and convolution state, %.1f MiB",
            num_slots,
            self.num_bytes / 2**20,
        )

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.pools for t in layer)

    def step(self, inputs: StepInputs) -> StateStep:
        """The step's rows by slot: decode rows (one token) together, chunks alone."""
        rows = range(len(inputs.row_num_tokens))
        decode = [r for r in rows if inputs.row_num_tokens[r] == 1]
        chunks = [
            StateChunk(start, start + n, _slot(inputs, r), inputs.row_start_pos[r] == 0)
            for r, start, n in zip(rows, inputs.row_starts, inputs.row_num_tokens, strict=True)
            if n > 1
        ]
        step = StateStep(self.pools, chunks=chunks)
        if decode:
            step.decode_slots = self._tensor([_slot(inputs, r) for r in decode])
            fresh = [inputs.row_start_pos[r] == 0 for r in decode]
            if any(fresh):  # one-token prompts; the others start with a chunk
                step.decode_fresh = on_device(fresh, torch.bool, self.device)
            if chunks:
                step.decode_index = self._tensor([inputs.row_starts[r] for r in decode])
        return step

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return on_device(values, torch.long, self.device)


def _slot(inputs: StepInputs, row: int) -> int:
    slot = inputs.state_slots[row]
    if slot is None:
        raise RuntimeError("a hybrid model's row was scheduled without a state slot")
    return slot


def state_bytes(shapes: Sequence[StateShapes]) -> int:
    """Bytes of one slot across the layers ``shapes`` describe."""
    total = 0
    for layer in shapes:
        for shape, dtype in layer:
            numel = 1
            for size in shape:
                numel *= size
            total += numel * torch.empty((), dtype=dtype).element_size()
    return total


class GatedRMSNorm:
    """An RMSNorm of ``x`` gated by ``silu(gate)``: normalised first, then gated
    (Gated DeltaNet), or gated first and normalised in ``num_groups`` groups (Mamba-2);
    in fp32 as torch's fused norm, in other dtypes through the module itself."""

    def __init__(self, module: Any, gate_first: bool, num_groups: int = 1) -> None:
        self.module = module
        self.weight: torch.Tensor = module.weight.detach()
        self.eps = float(module.variance_epsilon)
        self.gate_first = gate_first
        self.num_groups = num_groups

    def __call__(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or self.weight.dtype != torch.float32:
            out: torch.Tensor = self.module(x, gate)
            return out
        if not self.gate_first:
            normed = functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
            return normed * functional.silu(gate)
        h = x * functional.silu(gate)
        size = h.shape[-1] // self.num_groups
        groups = h.view(*h.shape[:-1], self.num_groups, size)
        normed = functional.rms_norm(groups, (size,), None, self.eps).view(h.shape)
        return normed * self.weight
