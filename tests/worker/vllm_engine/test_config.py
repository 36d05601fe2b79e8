"""The engine arguments a vLLM worker starts with: tokenq's defaults under what is asked."""

from __future__ import annotations

import json

import pytest

from worker.vllm_engine import config
from worker.vllm_engine.options import VllmOptionError, VllmOptions

KNOWN = (
    "scheduling_policy",
    "disable_log_stats",
    "structured_outputs_config",
    "enable_lora",
    "max_loras",
    "max_lora_rank",
    "max_num_seqs",
    "runner",
    "convert",
    "pooler_config",
)


@pytest.fixture(autouse=True)
def _known_names(monkeypatch: pytest.MonkeyPatch) -> None:
    # The main environment has no vLLM to read EngineArgs' names from.
    monkeypatch.setattr(config, "engine_arg_names", lambda: list(KNOWN))


def test_without_lora_it_serves_no_adapters_and_guides_with_xgrammar() -> None:
    started = config.vllm_engine_config("m", VllmOptions(), {})
    assert started.max_loras == 0 and not started.enable_lora
    assert "max_loras" not in started.engine_args
    assert started.engine_args["structured_outputs_config"]["backend"] == "xgrammar"


def test_lora_takes_the_built_in_engines_adapter_limits_unless_given() -> None:
    started = config.vllm_engine_config("m", VllmOptions(enable_lora=True), {})
    assert started.engine_args["enable_lora"] is True
    assert (started.max_loras, started.engine_args["max_lora_rank"]) == (4, 16)
    given = config.vllm_engine_config(
        "m", VllmOptions(enable_lora=True), {"max_loras": 2, "max_lora_rank": 8}
    )
    assert (given.max_loras, given.engine_args["max_lora_rank"]) == (2, 8)
    by_pair = config.vllm_engine_config(
        "m", VllmOptions(vllm_arg=["enable_lora=true", "max_loras=3"]), {}
    )
    assert by_pair.max_loras == 3


@pytest.mark.parametrize(
    ("pooling", "pooling_type"), [("mean", "MEAN"), ("last", "LAST"), ("cls", "CLS")]
)
def test_a_pooling_worker_pools_as_the_built_in_engine_unless_given(
    pooling: str, pooling_type: str
) -> None:
    started = config.vllm_engine_config("m", VllmOptions(runner="pooling"), {}, pooling)
    assert started.engine_args["runner"] == "pooling"
    assert started.engine_args["pooler_config"] == {"pooling_type": pooling_type}
    own = {"pooling_type": "CLS", "use_activation": False}
    given = config.vllm_engine_config(
        "m", VllmOptions(runner="pooling", vllm_arg=[f"pooler_config={json.dumps(own)}"]), {}
    )
    assert given.engine_args["pooler_config"] == own


def test_a_generating_worker_sets_no_pooler() -> None:
    assert "pooler_config" not in config.vllm_engine_config("m", VllmOptions(), {}).engine_args


def test_an_unknown_pooling_is_refused_by_name() -> None:
    with pytest.raises(VllmOptionError, match="--pooling 'max': use one of mean, last, cls"):
        config.vllm_engine_config("m", VllmOptions(runner="pooling"), {}, "max")
