"""Options generated from any dataclass whose fields carry their help."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import typer
from typer.testing import CliRunner

from worker.flags import Flags, command_with_options, option_fields


@dataclass(frozen=True)
class Parallel:
    tensor_parallel_size: int = field(default=1, metadata={"help": "GPUs a model spans"})
    enable_prefix_caching: bool = field(default=True, metadata={"help": "reuse prefixes"})
    not_an_option: str = "kept off the command line"

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}"
            )


@dataclass(frozen=True)
class Names:
    label: str | None = field(default=None, metadata={"help": "a name"})


def app_over(*sources: type, seen: list[tuple[Flags, int]]) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @command_with_options(*sources)
    def run(flags: Flags, verbose: int = 0) -> None:
        seen.append((flags, verbose))

    return app


def test_the_fields_with_help_are_the_options() -> None:
    assert [f.name for f in option_fields(Parallel)] == [
        "tensor_parallel_size",
        "enable_prefix_caching",
    ]
    with pytest.raises(TypeError, match="not a dataclass"):
        option_fields(int)


def test_a_command_parses_them_beside_its_own_parameters() -> None:
    seen: list[tuple[Flags, int]] = []
    app = app_over(Parallel, Names, seen=seen)
    args = ["--tensor-parallel-size", "2", "--no-enable-prefix-caching", "--label", "x"]
    result = CliRunner().invoke(app, [*args, "--verbose", "3"])
    assert result.exit_code == 0, result.output
    [(flags, verbose)] = seen
    assert flags.of(Parallel) == Parallel(tensor_parallel_size=2, enable_prefix_caching=False)
    assert (flags.of(Names), verbose) == (Names(label="x"), 3)
    assert "--not-an-option" in CliRunner().invoke(app, ["--not-an-option", "y"]).output


def test_defaults_are_the_fields_and_unknown_names_are_refused() -> None:
    assert Flags.defaults(Parallel).of(Parallel) == Parallel()
    assert Flags.defaults(Parallel, tensor_parallel_size=4).of(Parallel).tensor_parallel_size == 4
    with pytest.raises(TypeError, match="not an option of Parallel: label"):
        Flags.defaults(Parallel, label="x")
    with pytest.raises(ValueError, match="tensor_parallel_size must be at least 1, got 0"):
        Flags.defaults(Parallel, tensor_parallel_size=0).of(Parallel)


def test_an_option_declared_twice_or_without_a_default_is_a_mistake_at_import() -> None:
    @dataclass(frozen=True)
    class Again:
        label: str = field(default="", metadata={"help": "again"})

    @dataclass(frozen=True)
    class Required:
        model: str = field(metadata={"help": "no default"})

    def run(flags: Flags) -> None:
        del flags

    with pytest.raises(TypeError, match="options declared twice in Names, Again: label"):
        command_with_options(Names, Again)(run)
    with pytest.raises(TypeError, match="option model needs a default"):
        command_with_options(Required)(run)
