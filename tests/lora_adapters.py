"""Small LoRA adapters made with PEFT on the default model (fixed seeds, random weights
large enough to change its greedy output), and transformers' greedy output with one
merged in: the references the LoRA tests compare against."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    seed: int
    rank: int
    alpha: int
    targets: tuple[str, ...]


SPECS = (
    AdapterSpec("poet", 1, 8, 16, tuple(ALL_PROJECTIONS)),
    AdapterSpec("pirate", 2, 4, 16, ("q_proj", "v_proj", "down_proj")),
    AdapterSpec("clerk", 3, 8, 32, ("o_proj", "gate_proj", "up_proj")),
)


@contextmanager
def _peft_quietly() -> Iterator[None]:
    """peft reads attributes transformers has deprecated (FutureWarning); not ours to fix."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _base(model_path: str) -> Any:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return model.eval()


def make_adapter(model_path: str, spec: AdapterSpec, out_dir: Path) -> Path:
    """Save ``spec``'s adapter as a PEFT directory under ``out_dir``."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(spec.seed)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.targets),
        init_lora_weights=False,  # random A and B: the adapter changes the output
        lora_dropout=0.0,
    )
    with _peft_quietly():
        peft_model = get_peft_model(_base(model_path), config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.mul_(0.5)  # strong enough to change tokens, not so strong as to be noise
    path = out_dir / spec.name
    with _peft_quietly():
        peft_model.save_pretrained(str(path))
    return path


def merged_greedy(
    model_path: str, adapter: Path | None, prompts: list[list[int]], max_tokens: int
) -> list[list[int]]:
    """transformers' greedy tokens for each prompt alone, with ``adapter`` merged."""
    from peft import PeftModel

    model = _base(model_path)
    if adapter is not None:
        with _peft_quietly():
            model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                do_sample=False,
            )
            outputs.append(_trim_eos(out[0, len(prompt) :].tolist(), model))
    return outputs


def _trim_eos(ids: list[int], model: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    ends = [i for i, t in enumerate(ids) if t in eos_ids]
    return ids[: ends[0] + 1] if ends else ids
