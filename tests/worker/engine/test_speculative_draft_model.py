"""Draft-model proposals: a model sharing the target's tokenizer proposes greedily;
the output is the target's own, token for token, whatever the draft proposes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.worker.engine.conftest import NEEDS_W8A8, EngineFactory, TinyModels
from tests.worker.engine.speculative_helpers import (
    NOVEL,
    REPEATING,
    accepted_since,
    chat,
    requests_for,
    same_as_without,
    tokens_of,
)
from tests.worker.engine.tiny_models import SPECS_BY_NAME, build_model, make_config
from worker.engine import Engine, EngineConfig
from worker.engine.errors import UnsupportedModel
from worker.engine.quantization import Int8Projection
from worker.engine.speculative.config import SpeculativeConfig

VOCAB_SIZE = 49152  # the default model's


def _draft(model: str | Path, quantization: str | None = None) -> SpeculativeConfig:
    weights = "" if quantization is None else f', "quantization": "{quantization}"'
    return SpeculativeConfig.from_json(
        f'{{"model": "{model}", "num_speculative_tokens": 3, "disable_by_batch_size": 64{weights}}}'
    )


def test_the_target_as_its_own_draft_keeps_almost_every_draft(
    make_engine: EngineFactory, model_path: str
) -> None:
    plain = make_engine()
    spec = make_engine(speculative_config=_draft(model_path))
    prompts = [chat(plain, text) for text in (*REPEATING[:2], *NOVEL)]
    _, _, proposed, kept = same_as_without(plain, spec, prompts, max_tokens=24, logprobs=1)
    assert proposed > 0 and kept / proposed > 0.9
    # Shadows of finished sequences are let go at the next step.
    assert spec.speculator is not None
    shadows = spec.speculator.proposer.shadows  # type: ignore[attr-defined]
    last = requests_for(prompts[:1], max_tokens=2)
    spec.generate(last)
    assert set(shadows) <= {last[0].request_id}


def test_the_target_quantized_is_its_own_draft_and_the_output_stays_the_targets(
    make_engine: EngineFactory, model_path: str
) -> None:
    plain = make_engine()
    spec = make_engine(speculative_config=_draft(model_path, "int8"))
    assert spec.speculator is not None
    draft = spec.speculator.proposer.runner  # type: ignore[attr-defined]
    assert draft.quantization == "int8" and spec.runner.quantization is None
    assert isinstance(draft.forward_fn.lm_head, Int8Projection)
    assert not isinstance(getattr(spec.runner.forward_fn, "lm_head", None), Int8Projection)
    prompts = [chat(plain, text) for text in (*REPEATING[:2], *NOVEL)]
    kwargs = {"max_tokens": 24, "logprobs": 1, "ignore_eos": True}
    _, _, proposed, kept = same_as_without(plain, spec, prompts, **kwargs)
    # 8-bit weights choose the fp32 model's token almost always.
    assert proposed > 0 and kept / proposed > 0.7


def test_a_draft_models_quantization_is_checked_at_start_up(model_path: str) -> None:
    config = SpeculativeConfig.from_json('{"model": "small", "quantization": "w8a8"}')
    assert (config.method, config.quantization) == ("draft_model", "w8a8")
    with pytest.raises(ValueError, match="quantization applies to a draft model"):
        SpeculativeConfig.from_json('{"method": "ngram", "quantization": "int8"}')
    with pytest.raises(ValueError, match="must be one of int8, w8a8, got 'fp8'"):
        EngineConfig(model=model_path, speculative_config=_draft(model_path, "fp8"))


def test_a_draft_quantization_the_cpu_cannot_run_is_refused_as_the_drafts(
    monkeypatch: pytest.MonkeyPatch, tiny_models: TinyModels
) -> None:
    from worker.engine import quantization

    monkeypatch.setattr(quantization, "w8a8_available", lambda: False)
    tiny = tiny_models(SPECS_BY_NAME["llama"])
    config = EngineConfig(
        model=str(tiny), device="cpu", kv_cache_mib=2, speculative_config=_draft(tiny, "w8a8")
    )
    with pytest.raises(UnsupportedModel, match="draft model cannot load with quantization 'w8a8'"):
        Engine(config)


@NEEDS_W8A8
def test_a_compiled_w8a8_drafts_rows_go_through_fbgemm_together(
    monkeypatch: pytest.MonkeyPatch, tiny_models: TinyModels
) -> None:
    from worker.engine import quantization

    calls: list[tuple[int, bool]] = []  # each fbgemm call's rows, and whether one at a time
    real = quantization.w8a8_linear_rows

    def recorded(x: torch.Tensor, values: torch.Tensor, apart: bool = True) -> torch.Tensor:
        calls.append((x.shape[0], apart))
        return real(x, values, apart)

    monkeypatch.setattr(quantization, "w8a8_linear_rows", recorded)
    tiny = tiny_models(SPECS_BY_NAME["llama"])
    engine = Engine(
        EngineConfig(
            model=str(tiny),
            device="cpu",
            kv_cache_mib=2,
            compile=True,
            compile_max_tokens=4,
            speculative_config=_draft(tiny, "w8a8"),
        )
    )
    assert engine.speculator is not None
    draft = engine.speculator.proposer.runner  # type: ignore[attr-defined]
    assert draft.forward_fn.compiled is not None  # the draft's layers run compiled
    engine.generate(requests_for([[5, 6, 7]], max_tokens=12, ignore_eos=True))
    # The target is fp32: every call is the draft's, and several rows went in one.
    assert any(rows > 1 for rows, _ in calls)
    assert all(not apart for _, apart in calls)


@pytest.fixture(scope="module")
def random_draft(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama over the default model's whole vocabulary."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("draft") / "random-draft"
    config = make_config(SPECS_BY_NAME["llama"], vocab_size=VOCAB_SIZE)
    build_model(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(path)
    return path


def test_a_poor_draft_changes_nothing_but_the_speed(
    make_engine: EngineFactory, random_draft: Path
) -> None:
    plain = make_engine()
    spec = make_engine(speculative_config=_draft(random_draft))
    prompts = [chat(plain, text) for text in REPEATING[:2]]
    kwargs = {"max_tokens": 24, "ignore_eos": True}
    expected = plain.generate(requests_for(prompts, **kwargs))
    before = spec.stats()
    got = spec.generate(requests_for(prompts, **kwargs))
    for request_id, outputs in expected.items():
        assert tokens_of(got[request_id]) == tokens_of(outputs)
    proposed, kept = accepted_since(spec, before)
    assert proposed > kept  # a random model's drafts are mostly rejected, and taken back


def test_a_draft_model_with_another_vocabulary_is_refused(
    model_path: str, tiny_models: TinyModels
) -> None:
    tiny = tiny_models(SPECS_BY_NAME["llama"])  # the same tokenizer, 512 ids
    config = EngineConfig(model=model_path, kv_cache_mib=8, speculative_config=_draft(tiny))
    with pytest.raises(ValueError, match="does not share the target model's tokenizer"):
        Engine(config)


def test_a_draft_model_is_named_as_vllm_names_it() -> None:
    config = SpeculativeConfig.from_json('{"model": "small", "num_speculative_tokens": 2}')
    assert (config.method, config.model) == ("draft_model", "small")
    with pytest.raises(ValueError, match="a draft model is named by model"):
        SpeculativeConfig(method="draft_model")
