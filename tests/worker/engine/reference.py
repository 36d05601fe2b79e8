"""Greedy references from transformers' ``generate``, one request at a time (slow;
kept in the disk cache of :mod:`tests.reference`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from tests.reference import cached_json


@dataclass
class Reference:
    """transformers ``generate`` on one request alone: its tokens and, per step,
    the two best token ids and their logits."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    top2: list[tuple[int, float, int, float]]


def greedy_references(
    model_path: str,
    rows: list[dict[str, Any]],
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> list[Reference]:
    return cached_json(
        model_path,
        {"rows": rows, "device": device, "dtype": str(dtype)},
        __name__,
        lambda: _compute(model_path, rows, device, dtype),
        lambda refs: [asdict(ref) for ref in refs],
        lambda data: [_decode(item) for item in data],
    )


def _decode(item: dict[str, Any]) -> Reference:
    top2 = [(int(a), float(b), int(c), float(d)) for a, b, c, d in item["top2"]]
    return Reference(list(item["prompt_token_ids"]), list(item["token_ids"]), top2)


def _compute(
    model_path: str, rows: list[dict[str, Any]], device: str, dtype: torch.dtype
) -> list[Reference]:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    model = model.to(device).eval()
    return [_reference(model, tokenizer, row) for row in rows]


def _reference(model: Any, tokenizer: Any, row: dict[str, Any]) -> Reference:
    encoded = tokenizer.apply_chat_template(
        row["messages"], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    prompt = list(encoded["input_ids"])
    config = GenerationConfig(  # type: ignore[no-untyped-call]  # transformers is untyped here
        max_new_tokens=row["max_tokens"],
        do_sample=False,
        eos_token_id=None if row.get("ignore_eos") else model.generation_config.eos_token_id,
        pad_token_id=model.generation_config.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([prompt], device=model.device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=model.device),
            generation_config=config,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    return Reference(prompt, tokens, [_top2(step[0]) for step in out.logits])


def _top2(logits: torch.Tensor) -> tuple[int, float, int, float]:
    values, indices = torch.topk(logits.float(), 2)
    return int(indices[0]), float(values[0]), int(indices[1]), float(values[1])
