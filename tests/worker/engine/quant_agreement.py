"""Greedy agreement of a quantized engine with the fp32 engine on a workload: the
share of requests whose tokens are identical, the share of tokens before each
request's first difference, and the error of the chosen token's logprob over those
shared steps (shared by ``test_quantization.py`` and ``bench/latency.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.models import SamplingParams
from worker.engine import Engine, EngineRequest

# A step's tokens and the logprobs of each (token id, logprob).
Steps = list[tuple[int, float]]


@dataclass
class Agreement:
    num_requests: int = 0
    num_identical: int = 0
    num_tokens: int = 0
    num_shared_tokens: int = 0  # tokens before each request's first difference
    logprob_errors: list[float] = field(default_factory=list)

    def add(self, expected: Steps, got: Steps) -> None:
        self.num_requests += 1
        self.num_tokens += len(expected)
        shared = 0
        for (want, want_lp), (token, lp) in zip(expected, got, strict=True):
            if token != want:
                break
            shared += 1
            self.logprob_errors.append(abs(lp - want_lp))
        self.num_shared_tokens += shared
        self.num_identical += shared == len(expected)

    @property
    def share_identical(self) -> float:
        return self.num_identical / max(1, self.num_requests)

    @property
    def share_tokens(self) -> float:
        return self.num_shared_tokens / max(1, self.num_tokens)

    @property
    def max_logprob_error(self) -> float:
        return max(self.logprob_errors, default=0.0)

    @property
    def mean_logprob_error(self) -> float:
        return sum(self.logprob_errors) / max(1, len(self.logprob_errors))

    def summary(self) -> str:
        return (
            f"identical greedy output on {self.num_identical}/{self.num_requests} requests "
            f"({self.share_identical:.0%}); {self.share_tokens:.1%} of tokens before the first "
            f"difference; chosen-token logprob error max {self.max_logprob_error:.4f}, mean "
            f"{self.mean_logprob_error:.5f} (over {len(self.logprob_errors)} shared steps)"
        )


def workload_prompts(tokenizer: Any, rows: list[dict[str, Any]]) -> list[tuple[list[int], int]]:
    """Each row's chat prompt as token ids, with its ``max_tokens``."""
    prompts = []
    for row in rows:
        encoded = tokenizer.apply_chat_template(
            row["messages"], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        prompts.append((list(encoded["input_ids"]), int(row["max_tokens"])))
    return prompts


def greedy_steps(engine: Engine, prompts: list[tuple[list[int], int]]) -> list[Steps]:
    """Each prompt's greedy tokens (``ignore_eos``) with their logprobs, all in flight."""
    requests = [
        EngineRequest(
            f"agree-{i}",
            prompt,
            SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=0),
        )
        for i, (prompt, max_tokens) in enumerate(prompts)
    ]
    results = engine.generate(requests)
    return [
        [
            (int(e["token_id"]), float(e["logprob"]))
            for out in results[r.request_id]
            for e in out.logprobs or ()
        ]
        for r in requests
    ]


def agreement(expected: list[Steps], got: list[Steps]) -> Agreement:
    result = Agreement()
    for want, have in zip(expected, got, strict=True):
        result.add(want, have)
    return result
