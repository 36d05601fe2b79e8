"""LoRA adapters on the device: a bounded set resident, their deltas applied per row.

The store keeps, per decoder layer and per projection site (q/k/v fused, o, gate/up
fused, down), every resident adapter's ``A`` stacked into one tensor and each
part's ``B`` (scaling folded in) into another, zero-padded to ``max_lora_rank``:
slot ``s`` (1..max_loras) owns its rows, slot 0 means no adapter. A step's
:class:`LoraBatch` holds a one-hot ``[tokens, n]`` mask of which slot each token
uses; a site's delta is then two dense matmuls over the ``n`` slots in use
(``x @ A.T``, masked, ``@ B.T``), whatever the mix of adapters and base rows.

Why dense and masked rather than gathering each token's ``A`` and ``B`` (bmm) or one
matmul pair per adapter (segments): on the CPU the gather copies ``tokens x rank x
hidden`` floats per site and layer, and segments cost a handful of small ops per
adapter per site per layer; the masked form is a few ops per site whatever the mix.
``bench/lora_ops.py`` measures the three in one run.

Adapters load on demand (read from disk when a request brings one that is not
resident); once ``max_loras`` are resident the least recently used one that the
step does not need is overwritten. The scheduler keeps the adapters of running
requests within ``max_loras``, so a step always fits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional

from worker.engine.lora_weights import AdapterError, LoraWeights, load_adapter
from worker.engine.request import LoraRef


@dataclass(frozen=True)
class Site:
    """Projections that read the same input and run as one matmul, in output order."""

    name: str
    parts: tuple[str, ...]
    in_features: int
    out_features: tuple[int, ...]


def llama_sites(layer: Any) -> list[Site]:
    """The fused forward's four sites, sized from a decoder layer."""
    attn, mlp = layer.self_attn, layer.mlp

    def site(name: str, module: Any, parts: tuple[str, ...]) -> Site:
        linears = [getattr(module, p) for p in parts]
        outs = tuple(int(lin.out_features) for lin in linears)
        return Site(name, parts, int(linears[0].in_features), outs)

    return [
        site("qkv", attn, ("q_proj", "k_proj", "v_proj")),
        site("o", attn, ("o_proj",)),
        site("gate_up", mlp, ("gate_proj", "up_proj")),
        site("down", mlp, ("down_proj",)),
    ]


class _SiteBuffers:
    """One site of one layer: ``a`` is ``[max_loras * parts * rank, in]``; ``bt[p]``
    is ``[max_loras * rank, out_p]`` (B transposed, scaled)."""

    def __init__(self, site: Site, max_loras: int, rank: int, **like: Any) -> None:
        self.site = site
        self.rank = rank
        self.a = torch.zeros(max_loras * len(site.parts) * rank, site.in_features, **like)
        self.bt = [torch.zeros(max_loras * rank, out, **like) for out in site.out_features]

    def write(self, slot: int, layer: int, weights: LoraWeights) -> None:
        rank, num_parts = self.rank, len(self.site.parts)
        base = (slot - 1) * num_parts * rank
        self.a[base : base + num_parts * rank].zero_()
        for p, name in enumerate(self.site.parts):
            rows = slice((slot - 1) * rank, slot * rank)
            self.bt[p][rows].zero_()
            pair = weights.pairs.get((layer, name))
            if pair is None:
                continue  # the adapter leaves this projection alone
            a, b = pair
            r = a.shape[0]
            self.a[base + p * rank : base + p * rank + r].copy_(a)
            self.bt[p][rows.start : rows.start + r].copy_(b.T)

    def delta(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        num_tokens, n = x.shape[0], mask.shape[1]
        num_parts, rank = len(self.site.parts), self.rank
        xa = functional.linear(x, self.a[: n * num_parts * rank])
        xa = xa.view(num_tokens, n, num_parts, rank) * mask[:, :, None, None]
        outs = [
            xa[:, :, p, :].reshape(num_tokens, n * rank) @ self.bt[p][: n * rank]
            for p in range(num_parts)
        ]
        return outs[0] if num_parts == 1 else torch.cat(outs, dim=-1)


class LoraBatch:
    """One step's adapters: which slot each token uses, as a ``[tokens, n]`` mask."""

    def __init__(self, store: LoraStore, mask: torch.Tensor) -> None:
        self.store = store
        self.mask = mask

    def add(self, layer: int, site: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the site's base output for input ``x``) plus each row's delta."""
        buffers = self.store.buffers[layer][site]
        return y + buffers.delta(x, self.mask).to(y.dtype)


def apply_lora(
    lora: LoraBatch | None, layer: int, site: str, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """The forward's hook at each projection site: ``y`` itself when no row of the
    step uses an adapter."""
    return y if lora is None else lora.add(layer, site, x, y)


class LoraStore:
    """The resident adapters of one model (see the module docs)."""

    def __init__(
        self,
        sites: list[Site],
        num_layers: int,
        max_loras: int,
        max_lora_rank: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.sites = sites
        self.num_layers = num_layers
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.device = device
        self.dtype = dtype
        self.buffers: list[dict[str, _SiteBuffers]] = []  # allocated with the first adapter
        self._resident: OrderedDict[str, tuple[int, LoraRef]] = OrderedDict()
        self._staged: OrderedDict[LoraRef, LoraWeights] = OrderedDict()
        self.num_loads = 0

    @property
    def resident(self) -> list[str]:
        """Names of the resident adapters, least recently used first."""
        return list(self._resident)

    def check(self, ref: LoraRef) -> None:
        """Raise AdapterError now, for a request whose adapter cannot be served; the
        weights read are kept for its first step."""
        if self._slot_of(ref) is None and ref not in self._staged:
            self._stage(ref, self._read(ref))

    def batch(self, refs: Sequence[LoraRef | None], num_tokens: Sequence[int]) -> LoraBatch | None:
        """A step's LoraBatch: row ``i`` has ``num_tokens[i]`` tokens and adapter
        ``refs[i]``; loads what is not resident. None when no row uses one."""
        if not any(refs):
            return None
        slots = self._slots_for([r for r in refs if r is not None])
        token_slots = [
            slots[r] if r else 0 for r, n in zip(refs, num_tokens, strict=True) for _ in range(n)
        ]
        index = torch.tensor(token_slots, device=self.device)
        n = max(token_slots)
        columns = torch.arange(1, n + 1, device=self.device)
        mask = (index[:, None] == columns[None, :]).to(self.dtype)
        return LoraBatch(self, mask)

    def _slots_for(self, refs: list[LoraRef]) -> dict[LoraRef, int]:
        slots: dict[LoraRef, int] = {}
        for ref in dict.fromkeys(refs):
            slots[ref] = self._ensure(ref, set(slots.values()))
        return slots

    def _ensure(self, ref: LoraRef, pinned: set[int]) -> int:
        slot = self._slot_of(ref)
        if slot is not None:
            self._resident.move_to_end(ref.name)
            return slot
        weights = self._staged.pop(ref, None) or self._read(ref)
        slot = self._free_slot(pinned)
        self._write(slot, weights)
        self._resident.pop(ref.name, None)
        self._resident[ref.name] = (slot, ref)
        return slot

    def _slot_of(self, ref: LoraRef) -> int | None:
        found = self._resident.get(ref.name)
        return found[0] if found is not None and found[1] == ref else None

    def _free_slot(self, pinned: set[int]) -> int:
        taken = {slot for slot, _ in self._resident.values()}
        for slot in range(1, self.max_loras + 1):
            if slot not in taken:
                return slot
        for name, (slot, _) in self._resident.items():  # least recently used first
            if slot not in pinned:
                del self._resident[name]
                return slot
        raise RuntimeError(f"a step needs more than max_loras={self.max_loras} adapters")

    def _read(self, ref: LoraRef) -> LoraWeights:
        weights = load_adapter(ref.path)
        if weights.rank > self.max_lora_rank:
            raise AdapterError(
                f"adapter {ref.name!r} has rank {weights.rank}, over this worker's "
                f"--max-lora-rank {self.max_lora_rank}; raise it or retrain with a lower rank"
            )
        layers = {layer for layer, _ in weights.pairs}
        if max(layers) >= self.num_layers:
            raise AdapterError(
                f"adapter {ref.name!r} has weights for layer {max(layers)}, but the model has "
                f"{self.num_layers} layers: it was trained on another model"
            )
        self._check_shapes(ref, weights)
        return weights

    def _check_shapes(self, ref: LoraRef, weights: LoraWeights) -> None:
        dims = {
            part: (site.in_features, out)
            for site in self.sites
            for part, out in zip(site.parts, site.out_features, strict=True)
        }
        for (layer, name), (a, b) in weights.pairs.items():
            if (a.shape[1], b.shape[0]) != dims[name]:
                raise AdapterError(
                    f"adapter {ref.name!r}: layer {layer} {name} maps {a.shape[1]} -> "
                    f"{b.shape[0]}, the model's maps {dims[name][0]} -> {dims[name][1]}: "
                    "it was trained on another model"
                )

    def _stage(self, ref: LoraRef, weights: LoraWeights) -> None:
        self._staged[ref] = weights
        while len(self._staged) > self.max_loras:
            self._staged.popitem(last=False)

    def _write(self, slot: int, weights: LoraWeights) -> None:
        if not self.buffers:
            like = {"device": self.device, "dtype": self.dtype}
            self.buffers = [
                {
                    s.name: _SiteBuffers(s, self.max_loras, self.max_lora_rank, **like)
                    for s in self.sites
                }
                for _ in range(self.num_layers)
            ]
        for layer, sites in enumerate(self.buffers):
            for buffers in sites.values():
                buffers.write(slot, layer, weights)
        self.num_loads += 1
