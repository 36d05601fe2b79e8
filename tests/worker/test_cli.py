"""`tokenq worker`: its options are the fields of the dataclasses that declare them."""

from __future__ import annotations

from dataclasses import MISSING
from typing import Any

import pytest
from typer.testing import CliRunner

import worker.main
from producer.cli import app
from shared.settings import Settings
from worker.cli import OPTION_SOURCES
from worker.engine.config import EngineConfig
from worker.flags import HELP, option_fields
from worker.options import WorkerOptions
from worker.sim import SimConfig

runner = CliRunner()


def shown_default(name: str, default: Any) -> str | None:
    if isinstance(default, bool):
        return f"[default: {'' if default else 'no-'}{name.replace('_', '-')}]"
    return None if default is None else f"[default: {default}]"


def test_every_option_field_is_offered_with_its_help_and_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("typer.rich_utils.MAX_WIDTH", 400)  # one line per option
    shown = runner.invoke(app, ["worker", "--help"]).output
    lines = {line.split()[1]: line for line in shown.splitlines() if line.startswith("│ --")}
    fields = [f for source in OPTION_SOURCES for f in option_fields(source)]
    # Fields of each source (WorkerOptions, EngineConfig, VllmOptions) are among them.
    names = {f.name for f in fields}
    assert {"engine", "speculative_config", "compile", "quantization", "enable_lora"} <= names
    for f in fields:
        line = lines[f"--{f.name.replace('_', '-')}"]
        assert " ".join(f.metadata[HELP].split()) in " ".join(line.split()), f.name
        default = shown_default(f.name, f.default)
        assert default is None or default in line, (f.name, line)
    # The options that were there before they were generated, each still there.
    for flag in ("--redis", "--log-level", "--model", "--served-model-name", "--engine-process"):
        assert flag in lines


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Settings, WorkerOptions, Any]]:
    """What `tokenq worker` would have run, instead of running it."""
    calls: list[tuple[Settings, WorkerOptions, Any]] = []
    monkeypatch.setattr(worker.main, "run_worker", lambda *args: calls.append(args))
    return calls


def test_flags_parse_into_the_dataclasses(ran: list[tuple[Settings, WorkerOptions, Any]]) -> None:
    args = ["--model", "org/model", "--served-model-name", "m", "--burst", "--max-num-seqs", "8"]
    args += ["--no-self-check", "--async-scheduling", "--grammar-compile-timeout-s", "2.5"]
    result = runner.invoke(app, ["worker", *args, "--quantization", "int8"])
    assert result.exit_code == 0, result.output
    [(_, opts, config)] = ran
    assert opts == WorkerOptions(model="org/model", served_model_name="m", burst=True)
    assert config == EngineConfig(
        model="org/model",
        max_num_seqs=8,
        self_check=False,
        async_scheduling=True,
        grammar_compile_timeout_s=2.5,
        quantization="int8",
    )


def test_without_flags_each_takes_its_declared_default(
    ran: list[tuple[Settings, WorkerOptions, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENQ_DEFAULT_MODEL", "org/default")
    assert runner.invoke(app, ["worker"]).exit_code == 0
    [(_, opts, config)] = ran
    assert opts == WorkerOptions() and config == EngineConfig(model="org/default")


def test_a_simulated_model_takes_the_lora_limits(
    ran: list[tuple[Settings, WorkerOptions, Any]],
) -> None:
    result = runner.invoke(app, ["worker", "--model", "sim:knee=4", "--max-lora-rank", "64"])
    assert result.exit_code == 0, result.output
    assert ran[0][2] == SimConfig(knee=4, max_lora_rank=64)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-num-seqs", "many"], "Invalid value for '--max-num-seqs': Input should be a"),
        (
            ["--grammar-compile-timeout-s", "soon"],
            "Invalid value for '--grammar-compile-timeout-s'",
        ),
        (["--max-lora-rank", "0"], "max_lora_rank must be an integer of at least 1, got 0"),
        (["--pooling", "max"], "pooling must be one of mean, last, cls, got 'max'"),
        (["--self-check=yes"], "Option '--self-check' does not take a value"),
    ],
)
def test_a_bad_value_is_refused_by_name_before_anything_runs(
    ran: list[tuple[Settings, WorkerOptions, Any]], args: list[str], message: str
) -> None:
    result = runner.invoke(app, ["worker", "--model", "org/model", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.replace("│", " ").split()), result.output
    assert ran == []


def test_every_declared_option_has_a_default() -> None:
    for source in OPTION_SOURCES:
        assert all(f.default is not MISSING for f in option_fields(source))
