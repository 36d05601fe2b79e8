"""LoRA adapters on disk in the layouts workers read (a PEFT directory, a bare
safetensors file), with zero weights of a chosen rank: what registration reads an
adapter's rank from. No torch: written with safetensors' numpy API."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
from safetensors.numpy import save_file

HIDDEN = 8
PREFIX = "base_model.model.model.layers"


def lora_tensors(rank: int) -> dict[str, npt.NDArray[np.float32]]:
    """Two projections: q_proj of layer 0 at ``rank``, down_proj of layer 1 at a lower
    one (an adapter's rank is its largest pair's, as workers count it)."""
    low = max(1, rank // 2)
    return {
        f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": np.zeros((rank, HIDDEN), np.float32),
        f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": np.zeros((HIDDEN, rank), np.float32),
        f"{PREFIX}.1.mlp.down_proj.lora_A.weight": np.zeros((low, HIDDEN), np.float32),
        f"{PREFIX}.1.mlp.down_proj.lora_B.weight": np.zeros((HIDDEN, low), np.float32),
    }


def write_peft_dir(directory: Path, rank: int) -> Path:
    directory.mkdir(parents=True)
    config = {"r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "down_proj"]}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    save_file(lora_tensors(rank), str(directory / "adapter_model.safetensors"))
    return directory


def write_safetensors(file: Path, rank: int) -> Path:
    save_file(lora_tensors(rank), str(file))
    return file
