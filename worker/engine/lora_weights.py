"""Reading a LoRA adapter from disk: a PEFT directory or a bare safetensors file.

An adapter is, per decoder layer and per projection it targets, a pair ``A [r, in]``
and ``B [out, r]``; the projection's output gains ``scaling * x @ A.T @ B.T`` with
``scaling = alpha / r`` (``alpha / sqrt(r)`` with rsLoRA). Only what the engine can
apply per row is accepted; anything else is refused with what to change.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from shared.refusal import RefusalCode, RequestRefused

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
# Adapters train projections of a decoder layer's attention or MLP; which of them a
# model takes adapters on is its family's (worker.engine.lora.lora_sites).
_KEY_RE = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")


class AdapterError(RequestRefused):
    """An adapter that cannot be read or applied; the message says why (a request that
    names it is refused naming ``lora``)."""

    def __init__(self, message: str) -> None:
        super().__init__(RefusalCode.INVALID_VALUE, "lora", message)


@dataclass
class LoraWeights:
    """One adapter in memory (float32, on the CPU): ``pairs[(layer, projection)]`` is
    ``(A, B)`` with the scaling already folded into ``B``."""

    path: str
    rank: int
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)


def load_adapter(path: str) -> LoraWeights:
    """The adapter at ``path``; AdapterError saying what is wrong with it."""
    where = Path(path)
    if where.is_dir():
        config = _read_config(where / CONFIG_FILE)
        weights = where / WEIGHTS_FILE
    elif where.is_file():
        sibling = where.with_name(CONFIG_FILE)
        config = _read_config(sibling) if sibling.exists() else {}
        weights = where
    else:
        raise AdapterError(f"no LoRA adapter at {path} on this worker (check the path)")
    tensors, metadata = _read_tensors(weights)
    alpha = config.get("lora_alpha", metadata.get("lora_alpha"))
    _check_config(config, path)
    pairs = _pairs(tensors, path)
    rank = max(a.shape[0] for a, _ in pairs.values())
    rslora = bool(config.get("use_rslora", False))
    scaled = {key: (a, b * _scaling(alpha, a.shape[0], rslora)) for key, (a, b) in pairs.items()}
    return LoraWeights(path, rank, scaled)


def _read_config(file: Path) -> dict[str, Any]:
    try:
        config: dict[str, Any] = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise AdapterError(f"cannot read the adapter's config {file}: {e}") from e
    return config


def _read_tensors(file: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        with safe_open(str(file), framework="pt") as f:
            tensors = {key: f.get_tensor(key).float() for key in f.keys()}  # noqa: SIM118
            metadata = f.metadata() or {}
    except (OSError, ValueError, RuntimeError) as e:
        raise AdapterError(f"cannot read adapter weights {file}: {e}") from e
    return tensors, metadata


def _check_config(config: dict[str, Any], path: str) -> None:
    unsupported = [
        ("use_dora", "DoRA adapters"),
        ("modules_to_save", "modules_to_save (fully trained modules)"),
        ("alpha_pattern", "alpha_pattern"),
        ("fan_in_fan_out", "fan_in_fan_out"),
    ]
    for name, what in unsupported:
        if config.get(name):
            raise AdapterError(f"adapter {path}: {what} are not supported; use plain LoRA")
    if config.get("bias", "none") != "none":
        raise AdapterError(
            f"adapter {path}: trained biases (bias={config['bias']!r}) are not supported"
        )


def _pairs(
    tensors: dict[str, torch.Tensor], path: str
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY_RE.search(key)
        if match is None:
            raise AdapterError(
                f"adapter {path} trains {key!r}: only the attention and MLP projections "
                "of decoder layers are supported"
            )
        halves.setdefault((int(match.group(1)), match.group(3)), {})[match.group(4)] = tensor
    if not halves:
        raise AdapterError(f"adapter {path} holds no LoRA weights")
    pairs = {}
    for (layer, name), half in halves.items():
        a, b = half.get("A"), half.get("B")
        if a is None or b is None or a.shape[0] != b.shape[1]:
            raise AdapterError(f"adapter {path}: layer {layer} {name} lacks a matching A and B")
        pairs[(layer, name)] = (a, b)
    return pairs


def _scaling(alpha: Any, rank: int, rslora: bool) -> float:
    value = float(alpha) if alpha is not None else float(rank)  # no alpha given: scaling 1
    return value / math.sqrt(rank) if rslora else value / rank
