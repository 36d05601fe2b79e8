"""Command-line options generated from dataclasses, as vLLM's ``EngineArgs`` are: each
option is declared once, as a field with its type, its default and its help.

A field declared ``field(default=..., metadata={"help": "..."})`` is an option: its name
gives the flag (``max_num_seqs``: ``--max-num-seqs``; a ``bool``: ``--x/--no-x``), its
type what the flag parses, its default the flag's, its help what ``--help`` shows. A
field without help is not offered on the command line.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from typing import Annotated, Any, TypeVar, get_type_hints

import typer

HELP = "help"
T = TypeVar("T")


def option_fields(cls: type) -> tuple[Field[Any], ...]:
    """The fields of the dataclass ``cls`` that are command-line options."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    return tuple(f for f in fields(cls) if HELP in f.metadata)


@dataclass(frozen=True)
class Flags:
    """The values the generated options parsed, by field name."""

    values: Mapping[str, Any]

    @classmethod
    def defaults(cls, *sources: type, **given: Any) -> Flags:
        """Every option of ``sources`` at its default, but those ``given`` (as if parsed
        from a command line that set them)."""
        values = {f.name: f.default for source in sources for f in option_fields(source)}
        unknown = set(given) - set(values)
        if unknown:
            raise TypeError(f"not an option of {_names(sources)}: {', '.join(sorted(unknown))}")
        return cls({**values, **given})

    def of(self, cls: type[T], **given: Any) -> T:
        """``cls`` made from its options' values and ``given`` (its fields that are no
        option, or values decided elsewhere); ``cls`` checks them as it always does."""
        return cls(**{**self.options_of(cls), **given})

    def options_of(self, cls: type) -> dict[str, Any]:
        return {f.name: self.values[f.name] for f in option_fields(cls)}


def command_with_options(*sources: type) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a command ``f(flags: Flags, **own)``: the command typer builds takes f's
    own parameters and an option for each option field of each dataclass in ``sources``
    (names unique across them), and hands ``f`` their values as ``flags``."""

    def decorate(f: Callable[..., T]) -> Callable[..., T]:
        own = list(inspect.signature(f, eval_str=True).parameters.values())
        if not own or own[0].name != "flags":
            raise TypeError(f"{f.__name__} must take `flags` first")
        generated = [p for source in sources for p in _parameters(source)]
        parameters = [*own[1:], *generated]
        _unique([p.name for p in parameters], sources)
        names = [p.name for p in generated]

        def command(**kwargs: Any) -> T:
            return f(Flags({name: kwargs.pop(name) for name in names}), **kwargs)

        command.__name__, command.__qualname__ = f.__name__, f.__qualname__
        command.__doc__, command.__module__ = f.__doc__, f.__module__
        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        return command

    return decorate


def _parameters(cls: type) -> list[inspect.Parameter]:
    hints = get_type_hints(cls)
    return [_parameter(f, hints[f.name]) for f in option_fields(cls)]


def _parameter(f: Field[Any], annotation: Any) -> inspect.Parameter:
    if f.default is MISSING:
        raise TypeError(f"option {f.name} needs a default (field(default=..., metadata=...))")
    option = typer.Option(help=f.metadata[HELP])
    return inspect.Parameter(
        f.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=f.default,
        annotation=Annotated[annotation, option],
    )


def _unique(names: list[str], sources: tuple[type, ...]) -> None:
    twice = [name for name, count in Counter(names).items() if count > 1]
    if twice:
        raise TypeError(f"options declared twice in {_names(sources)}: {', '.join(sorted(twice))}")


def _names(sources: tuple[type, ...]) -> str:
    return ", ".join(source.__name__ for source in sources)
