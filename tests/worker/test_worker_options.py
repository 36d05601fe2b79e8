"""The worker's model-loading options reach the engine's config."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from producer.cli import app
from worker.engine.config import EngineConfig
from worker.flags import Flags
from worker.main import _vllm_shared, engine_config
from worker.options import WorkerOptions
from worker.vllm_engine.options import VllmOptions


def test_model_loading_options_reach_the_engine_config() -> None:
    config = engine_config(
        "org/model",
        Flags.defaults(EngineConfig, max_model_len=4096, self_check=False, trust_remote_code=True),
    )
    assert isinstance(config, EngineConfig)
    assert (config.max_model_len, config.self_check, config.trust_remote_code) == (
        4096,
        False,
        True,
    )
    default = engine_config("org/model", Flags.defaults(EngineConfig))
    assert isinstance(default, EngineConfig)
    assert default.self_check and not default.trust_remote_code and default.max_model_len is None


def test_the_worker_command_offers_them() -> None:
    result = CliRunner().invoke(app, ["worker", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for option in ("--max-model-len", "--self-check", "--no-self-check", "--trust-remote-code"):
        assert option in result.output


def test_grammar_compile_bounds_reach_the_engine_config() -> None:
    config = engine_config(
        "org/model",
        Flags.defaults(EngineConfig, grammar_compile_threads=2, grammar_compile_timeout_s=3.5),
    )
    assert isinstance(config, EngineConfig)
    assert (config.grammar_compile_threads, config.grammar_compile_timeout_s) == (2, 3.5)
    result = CliRunner().invoke(
        app, ["worker", "--model", "org/model", "--grammar-compile-threads", "0"]
    )
    assert result.exit_code == 2 and "grammar_compile_threads" in result.output


def test_quantization_reaches_the_engine_config_and_a_wrong_one_is_refused_by_name() -> None:
    config = engine_config("org/model", Flags.defaults(EngineConfig, quantization="int8"))
    assert isinstance(config, EngineConfig) and config.quantization == "int8"
    result = CliRunner().invoke(app, ["worker", "--model", "org/model", "--quantization", "int3"])
    assert result.exit_code == 2 and "quantization must be one of int8" in result.output
    for command in ("worker", "up"):
        shown = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
        assert "--quantization" in shown.output


def test_num_threads_reaches_the_engine_config_and_zero_is_refused() -> None:
    config = engine_config("org/model", Flags.defaults(EngineConfig, num_threads=1))
    assert isinstance(config, EngineConfig) and config.num_threads == 1
    result = CliRunner().invoke(app, ["worker", "--model", "org/model", "--num-threads", "0"])
    assert result.exit_code == 2 and "num_threads must be an integer of at least 1" in result.output
    shown = CliRunner().invoke(app, ["worker", "--help"], terminal_width=200)
    assert "--num-threads" in shown.output


def test_speculative_config_reaches_the_engine_config_and_a_wrong_one_is_refused() -> None:
    json = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'
    flags = Flags.defaults(WorkerOptions, EngineConfig, speculative_config=json)
    config = engine_config("org/model", flags)
    assert isinstance(config, EngineConfig) and config.speculative_config is not None
    assert config.speculative_config.num_speculative_tokens == 3
    assert config.for_device("cuda").async_scheduling is False  # verified step by step
    result = CliRunner().invoke(
        app, ["worker", "--model", "org/model", "--speculative-config", '{"method": "eagle"}']
    )
    assert result.exit_code == 2 and "method 'eagle' is not served" in result.output
    shown = CliRunner().invoke(app, ["worker", "--help"], env={"COLUMNS": "200"})
    assert "--speculative-config" in shown.output


def test_speculative_config_reaches_vllm_as_the_same_json() -> None:
    json = '{"method": "ngram", "num_speculative_tokens": 3}'
    flags = Flags.defaults(WorkerOptions, EngineConfig, VllmOptions, engine="vllm")
    shared = _vllm_shared(Flags({**flags.values, "speculative_config": json}))
    assert shared == {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}
    with pytest.raises(ValueError, match="--speculative-config: not valid JSON"):
        _vllm_shared(Flags({**flags.values, "speculative_config": "{ngram"}))
    draft = '{"model": "small", "quantization": "w8a8"}'  # the built-in engine's method
    with pytest.raises(ValueError, match="quantization 'w8a8' quantizes a draft at load"):
        _vllm_shared(Flags({**flags.values, "speculative_config": draft}))
    draft = '{"model": "small-awq", "quantization": "awq"}'  # vLLM's: passed through
    assert _vllm_shared(Flags({**flags.values, "speculative_config": draft}))


def test_a_pooling_vllm_worker_takes_the_built_in_engines_pooling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from worker.vllm_engine import config as vllm_config

    names = ["runner", "pooler_config", *vllm_config.DEFAULT_ENGINE_ARGS]
    monkeypatch.setattr(vllm_config, "engine_arg_names", lambda: names)  # no vLLM here
    flags = Flags.defaults(
        WorkerOptions, EngineConfig, VllmOptions, engine="vllm", runner="pooling", pooling="cls"
    )
    config = engine_config("org/model", flags)
    assert isinstance(config, vllm_config.VllmEngineConfig)
    assert config.engine_args["runner"] == "pooling"
    assert config.engine_args["pooler_config"] == {"pooling_type": "CLS"}
    shown = CliRunner().invoke(app, ["worker", "--help"], env={"COLUMNS": "200"})
    assert "--runner" in shown.output and "--convert" in shown.output
