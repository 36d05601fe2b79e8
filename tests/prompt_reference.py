"""Prompt logprobs from transformers alone: one forward over each prompt, fp32, and the
log-softmax of each position's logits at the next token (kept in the disk cache of
:mod:`tests.reference`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.reference import cached_json


@dataclass
class PromptScore:
    """One scored prompt token: its logprob and rank, and the top ids and logprobs."""

    logprob: float
    rank: int
    top_ids: list[int]
    top_logprobs: list[float]


def prompt_logprobs_reference(
    model_dir: str | Path, prompts: list[list[int]], num_top: int
) -> list[list[PromptScore]]:
    """Per prompt, its tokens from the second on, scored by transformers' own forward."""
    return cached_json(
        model_dir,
        {"prompts": prompts, "num_top": num_top},
        __name__,
        lambda: [_score(model_dir, ids, num_top) for ids in prompts],
        lambda value: [[asdict(s) for s in row] for row in value],
        lambda data: [[PromptScore(**s) for s in row] for row in data],
    )


def continuation_logprob(
    model_dir: str | Path, context: list[int], continuation: list[int]
) -> float:
    """The summed logprob of ``continuation`` after ``context``, as a loglikelihood task
    scores a choice."""
    scores = prompt_logprobs_reference(model_dir, [context + continuation], 0)[0]
    return sum(s.logprob for s in scores[len(context) - 1 :])


def _score(model_dir: str | Path, ids: list[int], num_top: int) -> list[PromptScore]:
    import torch

    model = _model(str(model_dir))
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    out = []
    for pos, target in enumerate(ids[1:]):
        row = logprobs[pos]
        chosen = row[target]
        values, indices = torch.topk(row, num_top) if num_top else (row[:0], row[:0].long())
        rank = int((row > chosen).sum()) + 1
        out.append(PromptScore(float(chosen), rank, indices.tolist(), values.tolist()))
    return out


_MODELS: dict[str, Any] = {}


def _model(model_dir: str) -> Any:
    if model_dir not in _MODELS:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
        model.eval()  # type: ignore[no-untyped-call]
        _MODELS[model_dir] = model
    return _MODELS[model_dir]
