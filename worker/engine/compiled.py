"""Small steps through decoder layers compiled by inductor on the CPU (``--compile``).

A step of a few tokens is bound by reading the weights, plus the fixed cost of some
forty small operations a layer, each dispatched on its own. With ``--compile`` each
layer's math (norms, q/k/v, rotary, the gated MLP, residuals) runs as one graph that
inductor compiled to C++, as vLLM's CPU backend compiles its model; attention stays
the step's own backend, called from the graph as a custom op (``tokenq::attend``)
that reads the step from a thread-local context.

One graph serves every layer of the same structure: it is traced (``make_fx``) once,
from the first such layer with its tensors swapped for the graph's inputs, so the
weights are arguments and each layer runs the graph with its own. A graph is compiled
for steps of 1, 2, 4... up to ``compile_max_tokens`` tokens (a step is padded to the
next size) when the runner starts, through ``torch._inductor.compile`` itself:
``torch.compile``'s dynamo would check its guards on every call, which costs more
than the operations it saves here. Inductor lowers oneDNN's packed linear only for
weights it packed itself, so the packed projections enter the graph as a custom op
(``tokenq::packed_linear``) that it calls as it is.

The compiled code is kept in inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``,
by default beside tokenq's model cache), so a restarted worker loads it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from worker.engine.attention import AttentionSpec, AttentionStep
from worker.engine.errors import UnsupportedModel
from worker.engine.models.decoder import Attention, DecoderLayer, DecoderModel, ForwardBatch
from worker.engine.models.layers import GatedMLP
from worker.engine.models.rotary import Rope
from worker.model_store import cache_dir

log = logging.getLogger(__name__)

# Attributes of a layer's parts that are not its math: attention's per-layer data
# reaches the graph through the context; the transformers modules are not called in fp32.
NOT_TRACED = frozenset({"module", "spec", "cache_index"})


class _StepContext(threading.local):
    """The step a compiled layer's attention reads, set around each layer's graph."""

    step: AttentionStep | None = None
    num_tokens: int = 0
    cache_index: int = 0
    spec: AttentionSpec | None = None


_CONTEXT = _StepContext()


@torch.library.custom_op("tokenq::attend", mutates_args=())
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The step's attention over the context's real tokens (the rest are padding)."""
    step, spec, num_tokens = _CONTEXT.step, _CONTEXT.spec, _CONTEXT.num_tokens
    if step is None or spec is None:
        raise RuntimeError("tokenq::attend runs only inside a compiled step")
    out = step.attend(_CONTEXT.cache_index, q[:num_tokens], k[:num_tokens], v[:num_tokens], spec)
    if num_tokens == q.shape[0]:
        return out
    padded = q.new_zeros(q.shape)
    padded[:num_tokens] = out
    return padded


@attend.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(q)


@torch.library.custom_op("tokenq::packed_linear", mutates_args=())
def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """oneDNN's linear on a weight it packed (``Projection``)."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return out


@packed_linear.register_fake
def _(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


class _TracedStep:
    """What a layer being traced sees as its step: attention through the custom op."""

    lora = None

    @property
    def attention(self) -> _TracedStep:
        return self

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec
    ) -> torch.Tensor:
        out: torch.Tensor = torch.ops.tokenq.attend(q, k, v)
        return out


Slot = tuple[Any, str]  # an object of the layer and the name of one of its tensors


def _parts(obj: Any) -> list[tuple[str, Any]]:
    """The traced attributes of one of tokenq's layer parts, in a fixed order."""
    return [(name, value) for name, value in sorted(vars(obj).items()) if name not in NOT_TRACED]


def _is_part(value: Any) -> bool:
    return hasattr(value, "__dict__") and type(value).__module__.startswith("worker.")


def layer_slots(obj: Any) -> list[Slot]:
    """Every tensor the layer ``obj`` computes with, found through its parts."""
    slots: list[Slot] = []
    for name, value in _parts(obj):
        if isinstance(value, torch.Tensor):
            slots.append((obj, name))
        for item in value if isinstance(value, tuple) else (value,):
            if _is_part(item):
                slots.extend(layer_slots(item))
    return slots


def structure(obj: Any) -> tuple[Any, ...]:
    """What a layer's graph is specialised on: its parts' types and settings, and its
    tensors' shapes and dtypes (not their values)."""
    described: list[Any] = [type(obj).__qualname__]
    for name, value in _parts(obj):
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, torch.Tensor):
                described.append((name, tuple(item.shape), item.dtype, item.layout))
            elif _is_part(item):
                described.append((name, structure(item)))
            else:
                described.append((name, repr(item)))
    return tuple(described)


def _set(slots: list[Slot], tensors: list[torch.Tensor]) -> None:
    for (owner, name), tensor in zip(slots, tensors, strict=True):
        object.__setattr__(owner, name, tensor)  # frozen dataclasses (int8 weights) too


def bucket_sizes(max_num_tokens: int) -> list[int]:
    """1, 2, 4... and ``max_num_tokens`` itself."""
    sizes = [1 << i for i in range(max_num_tokens.bit_length()) if 1 << i < max_num_tokens]
    return [*sizes, max_num_tokens]


CompiledFn = Callable[..., Any]


class CompiledLayers:
    """The decoder's layers compiled for steps of up to ``max_num_tokens`` tokens (see
    the module docs); ``num_steps`` counts the steps they ran."""

    def __init__(self, model: DecoderModel, name: str, max_num_tokens: int) -> None:
        check_compilable(model, name)
        self.model, self.name = model, name
        self.sizes = bucket_sizes(max_num_tokens)
        self.slots = [layer_slots(layer) for layer in model.layers]
        structures = [structure(layer) for layer in model.layers]
        kinds = list(dict.fromkeys(structures))
        self.kind_of = [kinds.index(s) for s in structures]
        self.first_of = [structures.index(kind) for kind in kinds]
        self.graphs: dict[tuple[int, int], CompiledFn] = {}
        self.num_steps = 0

    def compile(self) -> None:
        """Every graph, for every size (from inductor's cache where it has them)."""
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir().parent / "inductor"))
        _import_inductor()
        started = time.perf_counter()
        for kind, first in enumerate(self.first_of):
            for size in self.sizes:
                self.graphs[kind, size] = self._compile(first, size)
        log.info(
            "compiled %d layer graph(s) for steps of up to %d tokens in %.1f s (cache: %s)",
            len(self.graphs),
            self.sizes[-1],
            time.perf_counter() - started,
            os.environ["TORCHINDUCTOR_CACHE_DIR"],
        )

    def _compile(self, index: int, size: int) -> CompiledFn:
        """Layer ``index``'s graph for steps of ``size`` tokens, traced with fake tensors
        of static shapes in a mode with a shape environment (inductor caches only graphs
        traced with one)."""
        # A tensor the walk of the layer's parts missed stays real, to be found as a
        # constant of the graph and refused (``_check_traced``).
        mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True, allow_non_fake_inputs=True)
        args: list[torch.Tensor] = [
            mode.from_tensor(t, static_shapes=True) for t in self._example(index, size)
        ]
        with mode:
            graph = make_fx(self._traceable(index))(*args)
        self._check_traced(graph)
        _call_packed_linear(graph)
        compiled: CompiledFn = torch._inductor.compile(graph, list(args))
        return compiled

    def _example(self, index: int, size: int) -> list[torch.Tensor]:
        """A graph's inputs: a step's hidden states, cos and sin, the layer's tensors."""
        embed = self.model.embed_weight
        x = torch.zeros(size, embed.shape[1], dtype=embed.dtype)
        ropes = self.model.rotary(torch.zeros(size, dtype=torch.long), None, x.dtype)
        cos, sin = _rope_of(self.model.layers[index], ropes, size, x.dtype)
        return [x, cos, sin, *(getattr(owner, name) for owner, name in self.slots[index])]

    def _traceable(self, index: int) -> Callable[..., Any]:
        """Layer ``index`` as a function of its tensors (swapped in while it runs)."""
        layer, slots = self.model.layers[index], self.slots[index]
        originals = [getattr(owner, name) for owner, name in slots]
        key = _rope_key(layer)

        def run(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *weights: Any) -> Any:
            _set(slots, list(weights))
            try:
                step: Any = _TracedStep()
                return (layer(index, x, {key: (cos, sin)}, step),)
            finally:
                _set(slots, originals)

        return run

    def _check_traced(self, graph: torch.fx.GraphModule) -> None:
        """A tensor the graph would hold as a constant is one of the first layer's that
        the other layers would share: refused, never served."""
        held = [node.target for node in graph.graph.nodes if node.op == "get_attr"]
        if held:
            raise UnsupportedModel(
                f"model {self.name}: --compile cannot pass every tensor of its layers to the "
                f"compiled graph ({', '.join(map(str, held))}); serve it without --compile"
            )

    def takes(self, num_tokens: int, batch: ForwardBatch) -> bool:
        return batch.lora is None and batch.state is None and num_tokens <= self.sizes[-1]

    def __call__(
        self, x: torch.Tensor, ropes: dict[str, Rope], batch: ForwardBatch
    ) -> torch.Tensor:
        """The layers' output for the step's hidden states ``x``."""
        num_tokens = x.shape[0]
        size = next(s for s in self.sizes if s >= num_tokens)
        x = _padded(x, size)
        _CONTEXT.step, _CONTEXT.num_tokens = batch.attention, num_tokens
        try:
            for index, layer in enumerate(self.model.layers):
                assert isinstance(layer.mixer, Attention)
                _CONTEXT.cache_index, _CONTEXT.spec = layer.mixer.cache_index, layer.mixer.spec
                cos, sin = _rope_of(layer, ropes, num_tokens, x.dtype)
                weights = [getattr(owner, name) for owner, name in self.slots[index]]
                graph = self.graphs[self.kind_of[index], size]
                x = graph(x, _padded(cos, size), _padded(sin, size), *weights)[0]
        finally:
            _CONTEXT.step = None
        self.num_steps += 1
        return x[:num_tokens]


def _import_inductor() -> None:
    """Inductor, imported when first used (it takes seconds): its import of torch's
    mkldnn utilities warns that ``torch.jit.script_method`` is deprecated (torch 2.13),
    torch's business, not the operator's."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`torch.jit.script_method` is deprecated")
        import torch._inductor.compile_fx  # noqa: F401


def check_compilable(model: DecoderModel, name: str) -> None:
    """Only attention layers with a gated MLP compile (a MoE's routing and a hybrid's
    state layers depend on the data), and only on the CPU."""
    device = model.embed_weight.device.type
    if device != "cpu":
        raise UnsupportedModel(
            f"model {name}: --compile compiles steps for the CPU; on {device} steps run as "
            "CUDA graphs (drop --compile)"
        )
    for index, layer in enumerate(model.layers):
        if not isinstance(layer.mixer, Attention) or not isinstance(layer.mlp, GatedMLP):
            raise UnsupportedModel(
                f"model {name}: --compile compiles attention layers with a gated MLP, and "
                f"layer {index} has {type(layer.mixer).__name__} and {type(layer.mlp).__name__}; "
                "serve it without --compile"
            )


def _rope_key(layer: DecoderLayer) -> str:
    assert isinstance(layer.mixer, Attention)
    return layer.mixer.rope or ""


def _rope_of(
    layer: DecoderLayer, ropes: dict[str, Rope], num_tokens: int, dtype: torch.dtype
) -> Rope:
    """The layer's cos and sin; placeholders for a layer without rotary (not read)."""
    assert isinstance(layer.mixer, Attention)
    if layer.mixer.rope is not None:
        return ropes[layer.mixer.rope]
    none = torch.zeros(num_tokens, 1, 1, dtype=dtype)
    return none, none


def _padded(t: torch.Tensor, size: int) -> torch.Tensor:
    if t.shape[0] == size:
        return t
    return torch.cat([t, t.new_zeros(size - t.shape[0], *t.shape[1:])])


def _call_packed_linear(graph: torch.fx.GraphModule) -> None:
    """oneDNN's packed linear as ``tokenq::packed_linear`` (see the module docs)."""
    for node in graph.graph.nodes:
        if node.target is torch.ops.mkldnn._linear_pointwise.default:
            x, packed, bias = node.args[:3]
            out_features = int(packed.meta["val"].shape[0])
            node.target = torch.ops.tokenq.packed_linear.default
            node.args = (x, packed, bias, out_features)
    graph.recompile()


__all__ = ["CompiledLayers", "bucket_sizes"]
