"""The batched sampler against the formulas, on hand-made logits (no model)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from shared.models import SamplingParams
from worker.engine.sampler import Sampler, SamplingRow

VOCAB = 64


def row(history: list[int] | None = None, num_prompt: int = 0, **fields: Any) -> SamplingRow:
    params = SamplingParams(**{"temperature": 0.0, **fields})
    history = history or []
    return SamplingRow(params, len(history) - num_prompt, history, (), num_prompt)


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
    return Sampler(torch.device("cpu"))(logits, rows)[0]


def ramp() -> torch.Tensor:
    """Logits rising with the token id: greedy picks the last token."""
    return torch.linspace(0.0, 6.3, VOCAB)


def test_penalties_follow_openais_formula() -> None:
    """logit - count * frequency - (count > 0) * presence, over generated tokens only."""
    logits = torch.zeros(VOCAB)
    logits[[10, 11, 12]] = torch.tensor([5.0, 4.8, 3.5])
    # Token 10 occurs twice in the output, 11 once; 12 only in the prompt.
    history, num_prompt = [12, 12, 10, 11, 10], 2
    cases = {(0.0, 0.0): 10, (0.5, 0.0): 11, (0.0, 1.6): 12, (0.5, 1.0): 12, (-0.5, 0.0): 10}
    for (frequency, presence), expected in cases.items():
        got = sample(
            logits[None].clone(),
            [row(history, num_prompt, frequency_penalty=frequency, presence_penalty=presence)],
        )
        penalized = {
            t: float(logits[t]) - c * frequency - (c > 0) * presence
            for t, c in ((10, 2), (11, 1), (12, 0))
        }
        assert got == [max(penalized, key=lambda t: penalized[t])] == [expected]


def test_negative_penalties_favour_repeats() -> None:
    logits = torch.zeros(VOCAB)
    logits[[3, 4]] = torch.tensor([1.0, 1.5])
    assert sample(logits[None], [row([3], 0, frequency_penalty=-1.0)]) == [3]


def test_logit_bias_minus_100_bans_and_plus_100_forces() -> None:
    logits = ramp()[None].repeat(3, 1)
    rows = [row(), row(logit_bias={str(VOCAB - 1): -100}), row(logit_bias={"5": 100})]
    assert sample(logits, rows) == [VOCAB - 1, VOCAB - 2, 5]


def test_rows_keep_their_own_parameters_in_one_batch() -> None:
    logits = ramp()[None].repeat(2, 1)
    rows = [row(logit_bias={"7": 100}), row([VOCAB - 1], 0, presence_penalty=2.0)]
    assert sample(logits, rows) == [7, VOCAB - 2]


def test_repetition_penalty_counts_the_prompt_too() -> None:
    logits = torch.zeros(VOCAB)
    logits[[1, 2]] = torch.tensor([2.0, 1.5])
    assert sample(logits[None], [row([1], 1, repetition_penalty=1.5)]) == [2]


class Mask:
    """A grammar that allows only ``allowed``."""

    def __init__(self, allowed: list[int]) -> None:
        self.allowed = allowed

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        bitmask[index] = 0
        for t in self.allowed:
            bitmask[index, t // 32] |= 1 << (t % 32)


def test_grammar_masks_apply_to_their_rows_only() -> None:
    logits = ramp()[None].repeat(3, 1)
    rows = [row(), row(), row(temperature=1.0, seed=3)]
    rows[1].grammar = Mask([2, 40])
    rows[2].grammar = Mask([33])
    assert sample(logits, rows) == [VOCAB - 1, 40, 33]


def test_seeded_rows_sample_the_same_alone_and_batched() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, VOCAB)
    rows = [row(temperature=1.0, seed=s, top_p=0.9, min_p=0.01) for s in range(6)]
    batched = sample(logits, rows)
    alone = [sample(logits[i : i + 1], [rows[i]])[0] for i in range(6)]
    assert batched == alone
    assert len(set(sample(torch.zeros(6, VOCAB), rows))) > 1  # different seeds differ


def test_sampling_follows_the_distribution() -> None:
    """Frequencies of 4,000 seeded draws from a known distribution match it."""
    probs = torch.tensor([0.5, 0.3, 0.2] + [0.0] * (VOCAB - 3))
    logits = torch.log(probs.clamp(min=1e-12))
    rows = [SamplingRow(SamplingParams(seed=11), i, []) for i in range(4000)]
    picked = sample(logits[None].repeat(4000, 1), rows)
    for token, p in enumerate([0.5, 0.3, 0.2]):
        assert picked.count(token) / 4000 == pytest.approx(p, abs=0.03)


def test_top_k_and_min_p_cut_the_tail() -> None:
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1] + [1e-9] * (VOCAB - 4)))
    top_k = [SamplingRow(SamplingParams(seed=1, top_k=2), i, []) for i in range(300)]
    min_p = [SamplingRow(SamplingParams(seed=1, min_p=0.6), i, []) for i in range(300)]
    assert set(sample(logits[None].repeat(300, 1), top_k)) == {0, 1}
    assert set(sample(logits[None].repeat(300, 1), min_p)) == {0, 1}


def test_logprobs_are_the_models_own_with_the_top_ones() -> None:
    logits = ramp()[None].repeat(2, 1)
    ids, logprobs = Sampler(torch.device("cpu"))(
        logits, [row(logprobs=2, logit_bias={"0": 100}), row()]
    )
    expected = torch.log_softmax(ramp(), dim=-1)
    entry = logprobs[0]
    assert entry is not None and logprobs[1] is None
    assert entry["token_id"] == ids[0] == 0
    assert math.isclose(entry["logprob"], float(expected[0]), rel_tol=1e-5)
    assert [t["token_id"] for t in entry["top"]] == [VOCAB - 1, VOCAB - 2]
    assert math.isclose(entry["top"][0]["logprob"], float(expected[-1]), rel_tol=1e-5)


class OnlyToken:
    """A grammar that allows one token (or fails, given none)."""

    def __init__(self, token_id: int | None) -> None:
        self.token_id = token_id

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        if self.token_id is None:
            raise RuntimeError("matcher is broken")
        bitmask[index] = 0
        bitmask[index, self.token_id // 32] = 1 << (self.token_id % 32)


def test_a_grammar_that_fails_fails_its_row_alone() -> None:
    rows = [row(), row(), row()]
    rows[0].grammar, rows[1].grammar = OnlyToken(5), OnlyToken(None)
    errors: dict[int, str] = {}
    ids, _ = Sampler(torch.device("cpu"))(ramp().repeat(3, 1), rows, errors)
    assert ids[0] == 5 and ids[2] == VOCAB - 1  # the other rows as they would be
    assert list(errors) == [1] and "matcher is broken" in errors[1]
