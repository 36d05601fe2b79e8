"""``bench/engine.py --loras N``: a batch spread over N LoRA adapters against the base
model alone, on the same engine, the same workload, in the same run.

The adapters are random (rank 16, every projection of every layer, the heaviest kind
the engine takes by default), written as PEFT-named safetensors files to a temporary
directory; each request i of the workload runs with adapter i mod N.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save_file

from worker.engine import Engine, EngineRequest
from worker.engine.request import LoraRef

RANK = 16


class Drain(Protocol):
    def __call__(self, engine: Engine, arrivals: list[tuple[float, EngineRequest]]) -> Any: ...


def write_random_adapter(model: Any, path: Path, seed: int, rank: int = RANK) -> None:
    """A LoRA adapter over every q/k/v/o/gate/up/down projection of ``model``."""
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(model.model.layers):
        for holder in ("self_attn", "mlp"):
            for name, module in getattr(layer, holder).named_children():
                if not name.endswith("_proj"):
                    continue
                key = f"base_model.model.model.layers.{i}.{holder}.{name}"
                a = torch.randn(rank, module.in_features, generator=generator) * 0.02
                b = torch.randn(module.out_features, rank, generator=generator) * 0.02
                tensors[f"{key}.lora_A.weight"] = a
                tensors[f"{key}.lora_B.weight"] = b
    save_file(tensors, str(path), metadata={"lora_alpha": str(2 * rank)})


def report_loras(
    engine: Engine, requests: list[EngineRequest], num_loras: int, drain: Drain
) -> None:
    """Tokens per second with every request on the base model, then spread over
    ``num_loras`` adapters; prints the ratio (goal: >= 70% at 4 adapters on the CPU)."""
    with tempfile.TemporaryDirectory() as folder:
        refs = []
        for n in range(num_loras):
            path = Path(folder) / f"lora{n}.safetensors"
            write_random_adapter(engine.runner.model, path, seed=n)
            refs.append(LoraRef(f"lora{n}", str(path)))
        # Loads every adapter once, each with other prompts than it gets below, so the
        # measured runs find no prefix cached by the warm-up.
        drain(engine, _copies(requests[:8], "warm", refs[1:] + refs[:1]))
        base = drain(engine, _copies(requests, "base", [None]))
        mixed = drain(engine, _copies(requests, "mixed", refs))
    base_tps, mixed_tps = base.num_tokens / base.wall_s, mixed.num_tokens / mixed.wall_s
    print(
        f"loras: base alone {base_tps:.1f} tok/s; spread over {num_loras} adapters "
        f"(rank {RANK}, all projections) {mixed_tps:.1f} tok/s = "
        f"{100 * mixed_tps / base_tps:.0f}% of the base (goal >= 70% at 4 on the CPU)"
    )


def _copies(
    requests: list[EngineRequest], tag: str, refs: list[LoraRef | None] | list[LoraRef]
) -> list[tuple[float, EngineRequest]]:
    return [
        (
            0.0,
            EngineRequest(
                f"{tag}-{r.request_id}",
                r.prompt_token_ids,
                r.sampling,
                r.priority,
                r.arrival,
                lora=refs[i % len(refs)],
            ),
        )
        for i, r in enumerate(requests)
    ]
