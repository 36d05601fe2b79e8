"""Weights in 8 bits on the CPU: ``--quantization int8``.

One sequence's decode step reads every weight once for a single row of activations,
so its time is the time to read the weights; in 8 bits there is a quarter as much
to read. Each projection the shared layers own (attention q/k/v and output, the
gated MLP, a MoE's experts, the LM head) is quantized at load, weight-only, with
one scale per output channel (symmetric, ``[-127, 127]``).

Two methods share those weights and differ in what a step of up to
:data:`MAX_INT8_ROWS` rows (a decode step, a speculative verification) computes with:

- ``int8``: torch's own packed kernel, ``aten._weight_int8pack_mm``, whose fast CPU
  path takes bf16 activations: a step's activations enter it in bf16 and leave it in
  the model's dtype.
- ``w8a8``: fbgemm's dynamic int8 linear (``quantized::linear_dynamic``), as
  llama.cpp's Q8_0 and vLLM's W8A8-INT8 do: each row's activations are quantized to
  8 bits over their own range as the row enters, the dot products are computed in
  integers, and the result comes back in fp32. It is about twice as fast as ``int8``
  at one row and agrees less with fp32 (8-bit activations are coarser than bf16's;
  ``bench/latency.py --agreement`` prints both). It needs torch's fbgemm and a CPU
  whose int8 dot product does not saturate (VNNI: ``avx512_vnni``, ``avx_vnni``,
  ``amx_int8``) and is refused elsewhere. Rows go one at a time, so a row's result
  never depends on the other rows of its step (fbgemm would give them one range);
  a draft model's rows go together (``quantize_forward``'s ``rows_apart``).

Past :data:`MAX_INT8_ROWS` (a prefill chunk, a batch of decodes) those kernels are
slower than the fp32 oneDNN matmul, so a larger step reads the dequantized weights
through the ordinary :class:`Projection` instead; both use the same weights. The
dequantized values are also written back over the loaded model's own parameters
(the fused projections' views), so that transformers' forward, which the start-up
self-check holds the engine to, computes with exactly the weights the engine
serves: the check then measures the kernel and its bf16 or 8-bit activations
(``worker.engine.self_check`` allows each its tolerance), not the rounding of the
weights, which ``bench/latency.py --agreement`` measures against the fp32 engine.

Left in the checkpoint's dtype: the embeddings (a step reads a handful of their
rows), the layers with recurrent or convolution state of a hybrid, routers and
gates, and any projection whose input width the kernel does not take (a multiple
of :data:`IN_FEATURES_MULTIPLE`; others crash it).
"""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from worker.engine.errors import UnsupportedModel
from worker.engine.generic_forward import GenericForward
from worker.engine.models.decoder import Attention, DecoderModel
from worker.engine.models.layers import GatedMLP, Projection
from worker.engine.models.moe import SparseMoe
from worker.engine.models.shared_expert import SharedExpertMoe
from worker.engine.runner_support import cpu_flags

log = logging.getLogger(__name__)

MAX_INT8_ROWS = 4  # past this many rows the fp32 oneDNN matmul is faster
IN_FEATURES_MULTIPLE = 16  # what the kernel's CPU path reads at once
KERNEL_DTYPE = torch.bfloat16
INT8_MAX = 127
WRITE_CHUNK_VALUES = 1 << 18  # values widened at a time when writing weights back
# CPU flags of an int8 dot product that does not saturate (fbgemm's kernels need one
# to take activations over the full 8-bit range).
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


@dataclass(frozen=True)
class Int8Weight:
    """A weight ``[out, in]`` as int8 values and one scale per output row (``scales``
    already rounded to the kernel's dtype, so that ``dequantize`` is what it computes)."""

    values: torch.Tensor
    scales: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        return self.values.float() * self.scales.float()[:, None]

    def write_dequantized(self, weight: torch.Tensor) -> None:
        """Overwrite ``weight`` with the dequantized values, a few rows at a time (no
        fp32 copy of the whole weight beside it)."""
        chunk_rows = max(1, WRITE_CHUNK_VALUES // max(1, weight.shape[1]))
        with torch.no_grad():
            for start in range(0, weight.shape[0], chunk_rows):
                rows = slice(start, start + chunk_rows)
                part = self.values[rows].float() * self.scales[rows].float()[:, None]
                weight[rows].copy_(part)

    @property
    def num_bytes(self) -> int:
        return self.values.numel() + self.scales.numel() * self.scales.element_size()


def quantize_per_channel(weight: torch.Tensor) -> Int8Weight:
    """Symmetric int8 with the scale of each output row set by its largest magnitude."""
    w = weight.detach().float()
    largest = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny)
    scales = (largest / INT8_MAX).to(KERNEL_DTYPE)
    values = torch.round(w / scales.float()[:, None]).clamp(-INT8_MAX, INT8_MAX)
    return Int8Weight(values.to(torch.int8).contiguous(), scales)


class Int8Projection(Projection):
    """A projection reading int8 weights for up to :data:`MAX_INT8_ROWS` rows (with
    activations in bf16, or in 8 bits where ``dynamic``: ``w8a8``), and the same
    weights dequantized (the base class's oneDNN path) for more."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        int8: Int8Weight,
        dynamic: bool,
        rows_apart: bool = True,
    ):
        super().__init__(weight, bias)
        self.int8 = int8
        self.dynamic = dynamic
        self.rows_apart = rows_apart  # w8a8: each row's activations over their own range

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        width = x.shape[-1]
        rows = x.numel() // width
        if rows > MAX_INT8_ROWS:
            return super().__call__(x)
        values, scales = self.int8.values, self.int8.scales
        flat = x.reshape(rows, width)
        out: torch.Tensor
        if not self.dynamic:
            out = torch.ops.aten._weight_int8pack_mm(flat.to(KERNEL_DTYPE), values, scales)
        elif isinstance(values, FakeTensor):  # traced (``worker.engine.compiled``)
            out = torch.ops.tokenq.w8a8_linear(flat, values, self.rows_apart)
        else:
            out = w8a8_linear_rows(flat, values, self.rows_apart)
        out = out.to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        shaped: torch.Tensor = out.view(*x.shape[:-1], out.shape[-1])
        return shaped


# fbgemm's packed form of each ``w8a8`` weight, by the address of its int8 values
# (dropped with them): the traced graphs of ``worker.engine.compiled`` pass tensors.
_PACKED: dict[int, Any] = {}


@cache
def w8a8_available() -> bool:
    """Whether ``w8a8`` runs here (fbgemm and VNNI; see the module docs)."""
    fbgemm = "fbgemm" in torch.backends.quantized.supported_engines
    return fbgemm and not VNNI_FLAGS.isdisjoint(cpu_flags())


def _pack(int8: Int8Weight) -> None:
    """fbgemm's packed form of ``int8``, kept until its values are dropped."""
    zero_points = torch.zeros(int8.values.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch 2.13 calls quantized tensors deprecated
        warnings.simplefilter("ignore")
        weight = torch._make_per_channel_quantized_tensor(
            int8.values, int8.scales.double(), zero_points, 0
        )
        torch.backends.quantized.engine = "fbgemm"
        packed = torch.ops.quantized.linear_prepack(weight, None)
    key = int8.values.data_ptr()
    _PACKED[key] = packed
    weakref.finalize(int8.values, _PACKED.pop, key, None)


def w8a8_linear_rows(x: torch.Tensor, values: torch.Tensor, apart: bool = True) -> torch.Tensor:
    """``x`` ``[rows, in]`` times the packed int8 weight of ``values`` ``[out, in]``, in
    fp32: each row's activations quantized over their own range (``apart``), or all
    rows' over one range in one call."""
    packed = _PACKED[values.data_ptr()]
    x = x.float()
    if x.shape[0] == 1 or not apart:
        out: torch.Tensor = torch.ops.quantized.linear_dynamic(x, packed, False)
        return out
    rows = [x[i : i + 1] for i in range(x.shape[0])]
    return torch.cat([torch.ops.quantized.linear_dynamic(row, packed, False) for row in rows])


@torch.library.custom_op("tokenq::w8a8_linear", mutates_args=())
def w8a8_linear(x: torch.Tensor, values: torch.Tensor, apart: bool) -> torch.Tensor:
    """:func:`w8a8_linear_rows` as one op of a compiled graph."""
    return w8a8_linear_rows(x, values, apart)


@w8a8_linear.register_fake
def _(x: torch.Tensor, values: torch.Tensor, apart: bool) -> torch.Tensor:
    return x.new_empty((x.shape[0], values.shape[0]), dtype=torch.float32)


# A weight's int8 form already at hand (a GGUF file's Q8_0 blocks), or None.
Prequantized = Callable[[torch.Tensor], "Int8Weight | None"]


def quantize_projection(
    projection: Projection,
    prequantized: Prequantized | None = None,
    method: str = "int8",
    rows_apart: bool = True,
) -> Projection:
    """``projection`` in int8 for ``method`` (``prequantized``'s weights where it has
    them, else quantized from the weight), its weight (and the model's views of it)
    overwritten with the dequantized values; unchanged where the kernel cannot take it.
    ``rows_apart``: w8a8 quantizes each row's activations over their own range."""
    weight = projection.weight
    if isinstance(projection, Int8Projection) or not _kernel_takes(weight):
        return projection
    int8 = None if prequantized is None else prequantized(weight)
    if int8 is None:
        int8 = quantize_per_channel(weight)
    int8.write_dequantized(weight)
    # The oneDNN copy of the old values goes before the new one is made: at load no
    # more than one fp32 copy of a weight's values is ever held beside the weight.
    projection.packed = None
    dynamic = method == "w8a8"
    if dynamic:
        _pack(int8)
    return Int8Projection(weight, projection.bias, int8, dynamic, rows_apart)


def _kernel_takes(weight: torch.Tensor) -> bool:
    return (
        weight.dim() == 2
        and weight.device.type == "cpu"
        and weight.shape[1] % IN_FEATURES_MULTIPLE == 0
    )


def quantize_forward(
    forward: DecoderModel | GenericForward,
    method: str | None,
    name: str,
    prequantized: Prequantized | None = None,
    rows_apart: bool = True,
) -> None:
    """Quantize the fused forward's projections by ``method`` (None: leave them), taking
    the int8 form ``prequantized`` has of a weight where it has one, or refuse where the
    engine cannot serve it so. ``rows_apart=False`` is for a draft model's w8a8: a draft
    only proposes tokens, which the target verifies, so its rows may depend on each
    other, and a step's rows go through fbgemm in one call over one range (each
    speculative step starts the draft on the two or more tokens the target gained)."""
    if method is None:
        return
    if not isinstance(forward, DecoderModel):
        raise UnsupportedModel(
            f"model {name}: --quantization {method} needs the fused forward of a family tokenq "
            "describes; serve this model without --quantization"
        )
    if forward.embed_weight.device.type != "cpu":
        raise UnsupportedModel(
            f"model {name}: --quantization {method} runs on the CPU only; on "
            f"{forward.embed_weight.device.type} serve it without --quantization"
        )
    if method == "w8a8" and not w8a8_available():
        raise UnsupportedModel(
            f"model {name}: --quantization w8a8 needs torch's fbgemm and a CPU with VNNI "
            f"(one of {', '.join(sorted(VNNI_FLAGS))}), and this one has not both; serve it "
            "with --quantization int8"
        )
    done: list[Projection] = []
    read: list[Int8Weight] = []
    if prequantized is not None:
        prequantized = _noting(prequantized, read)

    def quantize(projection: Projection) -> Projection:
        quantized = quantize_projection(projection, prequantized, method, rows_apart)
        done.append(quantized)
        return quantized

    for layer in forward.layers:
        if isinstance(layer.mixer, Attention):
            layer.mixer.qkv = quantize(layer.mixer.qkv)
            layer.mixer.o = quantize(layer.mixer.o)
        _quantize_mlp(layer.mlp, quantize)
    forward.lm_head = quantize(forward.lm_head)
    int8 = [p.int8 for p in done if isinstance(p, Int8Projection)]
    log.info(
        "quantized %d of %d projections to int8 for %s (%d MiB of int8 weights; %d read "
        "from a GGUF file's Q8_0 blocks)",
        len(int8),
        len(done),
        method,
        sum(w.num_bytes for w in int8) >> 20,
        len(read),
    )


def _noting(prequantized: Prequantized, read: list[Int8Weight]) -> Prequantized:
    """``prequantized``, each weight it has noted in ``read``."""

    def lookup(weight: torch.Tensor) -> Int8Weight | None:
        int8 = prequantized(weight)
        if int8 is not None:
            read.append(int8)
        return int8

    return lookup


def _quantize_mlp(
    mlp: GatedMLP | SparseMoe | SharedExpertMoe, quantize: Callable[[Projection], Projection]
) -> None:
    if isinstance(mlp, SharedExpertMoe):
        _quantize_mlp(mlp.shared, quantize)
        _quantize_mlp(mlp.sparse, quantize)
    elif isinstance(mlp, GatedMLP):
        mlp.gate_up = quantize(mlp.gate_up)
        mlp.down = quantize(mlp.down)
    elif mlp.packed is not None:  # the experts as projections (fp32 on the CPU)
        mlp.packed = [(quantize(a), quantize(b)) for a, b in mlp.packed]
