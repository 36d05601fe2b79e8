"""LoRA adapters on the device: a bounded set resident, their deltas applied per row.

The store keeps, per decoder layer and per projection site (q/k/v fused, o, gate/up
fused, down), every resident adapter's ``A`` stacked into one tensor and each
part's ``B`` (scaling folded in) into another, zero-padded to ``max_lora_rank``:
slot ``s`` (1..max_loras) owns index ``s - 1``; rows of no adapter take no part. A
step's :class:`LoraBatch` groups the token rows by slot (padded to the largest group
with a zero row); a site's delta is then one gather of ``x``, two batched matmuls over
the groups (``x_g @ A_g.T @ B_g.T``) and one ``index_add`` into the base output,
whatever the mix of adapters and base rows: a handful of ops, and only the rows that
use an adapter are computed.

The grouped form computes only what is used, where the alternatives do not: a dense
form over all slots with a one-hot mask multiplies every row by every adapter, one
matmul pair per adapter costs a few small ops per adapter, site and layer, and
gathering each token's own ``A`` and ``B`` for a bmm copies ``tokens x rank x hidden``
per site and layer (``bench/lora_ops.py`` compares the four).

Adapters load on demand (read from disk when a request brings one that is not
resident); once ``max_loras`` are resident the least recently used one that the
step does not need is overwritten. The scheduler keeps the adapters of running
requests within ``max_loras``, so a step always fits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from worker.engine.lora_weights import AdapterError, LoraWeights, load_adapter
from worker.engine.request import LoraRef

if TYPE_CHECKING:
    from worker.engine.models.family import Family


@dataclass(frozen=True)
class Site:
    """Projections that read the same input and run as one matmul, in output order."""

    name: str
    parts: tuple[str, ...]
    in_features: int
    out_features: tuple[int, ...]


def lora_sites(family: Family, layer: Any) -> list[Site]:
    """The fused forward's sites of a family, sized from a decoder layer: fused q/k/v,
    o, and (but for a sparse MoE MLP, whose experts take no adapter) gate/up and down.
    A site's parts are the projections an adapter names (Phi-3's ``qkv_proj`` is one)."""
    attn, mlp = layer.self_attn, layer.mlp

    def site(name: str, module: Any, parts: tuple[str, ...]) -> Site:
        linears = [getattr(module, p) for p in parts]
        outs = tuple(int(lin.out_features) for lin in linears)
        return Site(name, parts, int(linears[0].in_features), outs)

    sites = [site("qkv", attn, family.qkv), site("o", attn, ("o_proj",))]
    if family.moe is None:
        sites += [site("gate_up", mlp, family.gate_up), site("down", mlp, ("down_proj",))]
    return sites


class _SiteBuffers:
    """One site of one layer: ``at`` is ``[max_loras, in, parts * rank]`` (A transposed,
    each part's rows side by side); ``bt[p]`` is ``[max_loras, rank, out_p]`` (B
    transposed, scaled). Slot ``s`` is index ``s - 1``."""

    def __init__(self, site: Site, max_loras: int, rank: int, **like: Any) -> None:
        self.site = site
        self.rank = rank
        num_parts = len(site.parts)
        self.at = torch.zeros(max_loras, site.in_features, num_parts * rank, **like)
        self.bt = [torch.zeros(max_loras, rank, out, **like) for out in site.out_features]

    def write(self, slot: int, layer: int, weights: LoraWeights) -> None:
        self.at[slot - 1].zero_()
        for p, name in enumerate(self.site.parts):
            self.bt[p][slot - 1].zero_()
            pair = weights.pairs.get((layer, name))
            if pair is None:
                continue  # the adapter leaves this projection alone
            a, b = pair
            r = a.shape[0]
            self.at[slot - 1, :, p * self.rank : p * self.rank + r].copy_(a.T)
            self.bt[p][slot - 1, :r].copy_(b.T)

    def delta(self, x: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        """``[n, rows, out]``: group ``g`` (slot ``g + 1``) of ``x``'s rows times its
        adapter; ``groups`` indexes ``x`` with one zero row appended (the padding)."""
        n, rank = groups.shape[0], self.rank
        padded = torch.cat([x, x.new_zeros(1, x.shape[1])])
        xa = torch.bmm(padded[groups], self.at[:n])
        outs = [
            torch.bmm(xa[:, :, p * rank : (p + 1) * rank], bt[:n]) for p, bt in enumerate(self.bt)
        ]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


class LoraBatch:
    """One step's adapters: the rows of each slot in use, as ``groups`` ``[n, rows]``
    (padded with the index of a zero row) and where each lands, ``rows`` ``[n * rows]``
    (padding lands on row 0 and adds zeros)."""

    def __init__(self, store: LoraStore, groups: torch.Tensor, rows: torch.Tensor) -> None:
        self.store = store
        self.groups = groups
        self.rows = rows

    def add(self, layer: int, site: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the site's base output for input ``x``) plus each row's delta; ``y``
        itself at a site the family takes no adapter on (a MoE model's dense MLPs)."""
        buffers = self.store.buffers[layer].get(site)
        if buffers is None:
            return y
        delta = buffers.delta(x, self.groups)
        # In place: y is the projection's fresh output, read by nothing else yet.
        return y.index_add_(0, self.rows, delta.view(-1, y.shape[1]).to(y.dtype))


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
        members: list[list[int]] = [[] for _ in range(max(slots.values()))]
        token = 0
        for ref, n in zip(refs, num_tokens, strict=True):
            if ref is not None:
                members[slots[ref] - 1].extend(range(token, token + n))
            token += n
        width = max(len(m) for m in members)
        groups = [[*m, *[token] * (width - len(m))] for m in members]  # token: the zero row
        rows = [i if i < token else 0 for group in groups for i in group]
        tensor = partial(torch.tensor, dtype=torch.long, device=self.device)
        return LoraBatch(self, tensor(groups), tensor(rows))

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
            if name not in dims:
                raise AdapterError(
                    f"adapter {ref.name!r} trains {name}, which this model's forward does not "
                    f"take adapters on (it takes {', '.join(dims)})"
                )
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
