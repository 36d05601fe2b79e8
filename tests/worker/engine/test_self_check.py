"""The start-up self-check refuses a model whose logits (or attention options) differ
from transformers' own; a family without a description serves through transformers'
forward only where the check passes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.worker.engine.test_families import run
from tests.worker.engine.tiny_models import (
    SPECS_BY_NAME,
    TinySpec,
    greedy,
    load_reference_model,
    prompts,
    save_tiny,
)
from worker.engine import Engine, EngineConfig, models
from worker.engine.errors import UnsupportedModel
from worker.engine.generic_forward import GenericForward
from worker.engine.models import state
from worker.engine.models.decoder import DecoderModel
from worker.engine.models.family import QKNorm, no_windows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def saved(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("self-check")
    starcoder = TinySpec("starcoder2", "starcoder2", {"sliding_window": 12})
    specs = [SPECS_BY_NAME["qwen3"], SPECS_BY_NAME["mistral"], SPECS_BY_NAME["lfm2"], starcoder]
    return {spec.name: save_tiny(spec, out, model_path) for spec in specs}


def broken(monkeypatch: pytest.MonkeyPatch, model_type: str, **changes: Any) -> None:
    family = models._BY_MODEL_TYPE[model_type]
    monkeypatch.setitem(models._BY_MODEL_TYPE, model_type, dataclasses.replace(family, **changes))


def test_a_wrong_description_fails_the_check_and_is_not_served(
    saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken(monkeypatch, "qwen3", qk_norm=QKNorm.NONE)  # Qwen3 without its q/k norm
    with pytest.raises(UnsupportedModel, match=r"self-check failed: its logits differ .* float32"):
        Engine(EngineConfig(model=str(saved["qwen3"]), device="cpu", kv_cache_mib=2))


def test_a_wrong_window_fails_the_check_though_the_probe_is_shorter_than_it(
    saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken(monkeypatch, "mistral", windows=no_windows)
    with pytest.raises(UnsupportedModel, match="layer 0's attention has sliding window 12"):
        Engine(EngineConfig(model=str(saved["mistral"]), device="cpu", kv_cache_mib=2))


def test_a_forward_gone_wrong_fails_the_check(
    saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    logits = DecoderModel._logits
    monkeypatch.setattr(DecoderModel, "_logits", lambda self, h: logits(self, h) * 1.01)
    with pytest.raises(UnsupportedModel, match="self-check failed"):
        Engine(EngineConfig(model=str(saved["qwen3"]), device="cpu", kv_cache_mib=2))
    # The same model, unbroken, passes and serves.
    monkeypatch.setattr(DecoderModel, "_logits", logits)
    assert Engine(
        EngineConfig(model=str(saved["qwen3"]), device="cpu", kv_cache_mib=2)
    ).runner.family


def test_a_hybrid_whose_state_is_not_carried_between_steps_fails_the_check(
    saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's second and third steps read a state the first ones left: dropped,
    the logits differ (LFM2's short convolutions: its smallest state)."""

    def zeros(pool: list[Any], slots: Any, fresh: Any) -> list[Any]:
        return [tensor.index_select(0, slots).zero_() for tensor in pool]

    monkeypatch.setattr(state, "gather_states", zeros)
    monkeypatch.setattr(state, "_chunk_state", lambda tensor, chunk: tensor[:1] * 0)
    with pytest.raises(UnsupportedModel, match="self-check failed"):
        Engine(EngineConfig(model=str(saved["lfm2"]), device="cpu", kv_cache_mib=2))


def test_a_family_without_description_serves_through_transformers_if_it_passes(
    saved: dict[str, Path],
) -> None:
    path = saved["starcoder2"]
    engine = Engine(EngineConfig(model=str(path), device="cpu", kv_cache_mib=2))
    assert isinstance(engine.runner.forward_fn, GenericForward)
    model = load_reference_model(path)
    expected = [greedy(model, prompt, 10) for prompt in prompts()]
    got = run(engine)
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    with pytest.raises(UnsupportedModel, match="passes the self-check"):
        Engine(EngineConfig(model=str(path), device="cpu", kv_cache_mib=2, self_check=False))


def test_a_fallback_model_that_ignores_the_engines_attention_is_refused(
    saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a model with attention of its own would: it never reads the KV cache.
    monkeypatch.setattr(GenericForward, "__init__", _keep_own_attention)
    with pytest.raises(UnsupportedModel, match="self-check failed"):
        Engine(EngineConfig(model=str(saved["starcoder2"]), device="cpu", kv_cache_mib=2))


def _keep_own_attention(self: GenericForward, model: object) -> None:
    self.model = model
    self._last_hidden = []
