"""Reference outputs from transformers' own ``generate``, one request at a time."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def _load(model_dir: Path) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    model.eval()
    return model, tokenizer


def greedy_reference(
    model_dir: Path, prompts: list[tuple[str, bool]], max_tokens: int
) -> list[list[int]]:
    """Greedy completion token ids for each (text, is_chat) prompt, generated alone."""
    import torch

    model, tokenizer = _load(model_dir)
    outputs = []
    for text, chat in prompts:
        ids = _encode(tokenizer, text, chat)
        with torch.inference_mode():
            out = model.generate(  # type: ignore[attr-defined]
                torch.tensor([ids]),
                max_new_tokens=max_tokens,
                do_sample=False,
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            )
        outputs.append(_trim_eos(out[0, len(ids) :].tolist(), tokenizer))
    return outputs


def _encode(tokenizer: object, text: str, chat: bool) -> list[int]:
    if chat:
        messages = [{"role": "user", "content": text}]
        encoded = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(encoded["input_ids"])
    return list(tokenizer(text)["input_ids"])  # type: ignore[operator]


def _trim_eos(ids: list[int], tokenizer: object) -> list[int]:
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    return ids[: ids.index(eos) + 1] if eos in ids else ids
