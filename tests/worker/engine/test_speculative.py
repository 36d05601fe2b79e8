"""Speculative decoding never changes a greedy output: tokens and logprobs are the
engine's own without it, on prompts whose answers copy their input (drafts accepted)
and on prompts whose answers do not, on the default model and a tiny random one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.worker.engine.conftest import EngineFactory, TinyModels
from tests.worker.engine.speculative_helpers import (
    NOVEL,
    REPEATING,
    SPECULATIVE,
    accepted_since,
    chat,
    logprobs_of,
    requests_for,
    same_as_without,
    speculative_engine,
    tokens_of,
)
from tests.worker.engine.tiny_models import SPECS_BY_NAME, prompts
from worker.engine import Engine, EngineConfig

MAX_TOKENS = 32


@pytest.mark.parametrize("texts", [REPEATING, NOVEL], ids=["repeating", "novel"])
def test_greedy_output_and_logprobs_are_unchanged(
    make_engine: EngineFactory, texts: tuple[str, ...]
) -> None:
    plain, spec = make_engine(), speculative_engine(make_engine)
    prompts_ = [chat(plain, t) for t in texts]
    expected, got, proposed, kept = same_as_without(
        plain, spec, prompts_, max_tokens=MAX_TOKENS, logprobs=2
    )
    for request_id, outputs in expected.items():
        assert [o.index for o in got[request_id]] == list(range(len(outputs)))
    if texts is REPEATING:
        assert 0 < kept <= proposed  # answers that copy their input
    assert spec.kv_cache.usage == 0.0  # every block, drafts' included, went back


def test_one_stream_takes_fewer_steps_with_speculation(make_engine: EngineFactory) -> None:
    plain, spec = make_engine(), speculative_engine(make_engine)
    prompt = chat(plain, REPEATING[0])
    steps = []
    for engine in (plain, spec):
        before = engine.num_steps
        engine.generate(requests_for([prompt], max_tokens=MAX_TOKENS, ignore_eos=True))
        steps.append(engine.num_steps - before)
    assert steps[1] < steps[0]


def test_a_request_that_opts_out_is_not_drafted(make_engine: EngineFactory) -> None:
    spec = speculative_engine(make_engine)
    prompt = chat(spec, REPEATING[0])
    before = spec.stats()
    spec.generate(requests_for([prompt], max_tokens=16, speculative=False))
    assert accepted_since(spec, before) == (0, 0)


def test_speculation_stops_above_its_batch_size(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = speculative_engine(make_engine)
    assert spec.speculator is not None
    monkeypatch.setattr(spec.speculator, "config", SPECULATIVE.__class__(disable_by_batch_size=1))
    prompt = chat(spec, REPEATING[0])
    before = spec.stats()
    spec.generate(requests_for([prompt, prompt], max_tokens=8))  # two rows: none drafted
    assert accepted_since(spec, before) == (0, 0)
    spec.generate(requests_for([prompt], max_tokens=16))  # one row: drafted
    assert accepted_since(spec, before)[0] > 0


@pytest.fixture(scope="module")
def tiny_engines(tiny_models: TinyModels) -> tuple[Engine, Engine]:
    path: Path = tiny_models(SPECS_BY_NAME["llama"])
    config = EngineConfig(model=str(path), kv_cache_mib=8, max_num_seqs=8)
    spec = EngineConfig(
        model=str(path), kv_cache_mib=8, max_num_seqs=8, speculative_config=SPECULATIVE
    )
    return Engine(config), Engine(spec)


def test_a_tiny_random_model_gives_the_same_greedy_tokens(
    tiny_engines: tuple[Engine, Engine], one_thread: None
) -> None:
    plain, spec = tiny_engines
    # Each prompt twice over: its second half is what the first predicts.
    doubled = [p[:20] * 3 for p in prompts()]
    kwargs = {"max_tokens": 40, "ignore_eos": True, "logprobs": 1}
    expected = plain.generate(requests_for(doubled, **kwargs))
    got = spec.generate(requests_for(doubled, **kwargs))
    for request_id, outputs in expected.items():
        assert tokens_of(got[request_id]) == tokens_of(outputs)
        assert logprobs_of(got[request_id]) == pytest.approx(logprobs_of(outputs), abs=1e-4)
    assert spec.stats()["spec_decode_num_draft_tokens"] > 0
