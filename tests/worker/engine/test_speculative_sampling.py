"""Under sampling, speculation keeps the target distribution: a chi-square test of the
token drawn at a position where the n-gram proposal is an unlikely token, which fails
when the verification always accepts; and a seeded request samples the same tokens
with and without it."""

from __future__ import annotations

from collections import Counter
from math import exp, factorial

import pytest

from shared.models import SamplingParams
from tests.worker.engine.conftest import EngineFactory
from tests.worker.engine.factories import make_request
from tests.worker.engine.speculative_helpers import (
    REPEATING,
    accepted_since,
    chat,
    requests_for,
    speculative_engine,
    tokens_of,
)
from worker.engine import Engine
from worker.engine.speculative import speculator as speculator_module
from worker.engine.speculative.ngram import NgramProposer

# The n-gram proposes " green" after it; the model gives that about 0.16, " blue" 0.26.
CONTEXT = "red blue green red blue green red blue"
NUM_SAMPLES = 400
WAVE = 40
NUM_TOP = 8  # the bins: the model's top tokens, and all the others together (dof 8)


def _distribution(engine: Engine, prompt: list[int]) -> dict[int, float]:
    """The model's top tokens after ``prompt`` with their probabilities (temperature 1:
    the raw logits' softmax, which logprobs report)."""
    request = make_request(prompt, max_tokens=1, logprobs=NUM_TOP)
    (out,) = engine.generate([request])[request.request_id]
    assert out.logprobs is not None
    return {entry["token_id"]: exp(entry["logprob"]) for entry in out.logprobs[0]["top"]}


def _first_tokens(engine: Engine, prompt: list[int]) -> list[int]:
    """The first token of ``NUM_SAMPLES`` seeded draws (two tokens each, so that the
    first position carries a draft), run ``WAVE`` at a time: a wave's prefills leave
    room in the step's token budget for every row's draft."""
    first = []
    for start in range(0, NUM_SAMPLES, WAVE):
        requests = [
            make_request(
                prompt,
                request_id=f"s{seed}",
                sampling=SamplingParams(temperature=1.0, seed=seed, max_tokens=2, ignore_eos=True),
            )
            for seed in range(start, start + WAVE)
        ]
        results = engine.generate(requests)
        first += [tokens_of(results[r.request_id])[0] for r in requests]
    return first


def _p_value(samples: list[int], top: dict[int, float]) -> float:
    """Pearson's chi-square test of the samples against ``top`` (and the rest as one bin)."""
    counts = Counter(t if t in top else -1 for t in samples)
    expected = {t: NUM_SAMPLES * p for t, p in top.items()}
    expected[-1] = NUM_SAMPLES - sum(expected.values())
    statistic = sum((counts[b] - e) ** 2 / e for b, e in expected.items())
    return chi_square_survival(statistic, len(expected) - 1)


def chi_square_survival(statistic: float, dof: int) -> float:
    """P(X > statistic) for X chi-square with an even ``dof``: a Poisson tail, in closed
    form (no statistics package needed)."""
    if dof % 2:
        raise ValueError(f"an even number of degrees of freedom, got {dof}")
    half = statistic / 2
    return exp(-half) * sum(half**i / factorial(i) for i in range(dof // 2))


def test_the_sampled_distribution_is_the_targets(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = speculative_engine(make_engine)
    prompt = spec.tokenizer(CONTEXT)["input_ids"]
    (draft,) = NgramProposer(2, 4).propose(prompt, 1)
    top = _distribution(spec, prompt)
    assert 0.05 < top[draft] < 0.5  # a draft the target often rejects
    before = spec.stats()
    samples = _first_tokens(spec, prompt)
    proposed, kept = accepted_since(spec, before)
    assert proposed >= NUM_SAMPLES and 0 < kept < proposed
    assert _p_value(samples, top) > 1e-3
    # The same test catches a verification that keeps every draft.
    monkeypatch.setattr(speculator_module, "num_accepted", lambda targets, drafts: len(drafts))
    assert _p_value(_first_tokens(spec, prompt), top) < 1e-6


def test_a_seeded_request_samples_the_same_tokens_with_and_without_speculation(
    make_engine: EngineFactory,
) -> None:
    plain, spec = make_engine(), speculative_engine(make_engine)
    prompts = [chat(plain, text) for text in REPEATING]
    kwargs = {"temperature": 0.8, "seed": 11, "max_tokens": 32, "logprobs": 1}
    expected = plain.generate(requests_for(prompts, **kwargs))
    before = spec.stats()
    got = spec.generate(requests_for(prompts, **kwargs))
    for request_id, outputs in expected.items():
        assert tokens_of(got[request_id]) == tokens_of(outputs)
    assert accepted_since(spec, before)[1] > 0
