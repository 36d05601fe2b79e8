"""What crosses the engine process's pipe (``worker.engine_process``), each message a
type of its own.

The worker sends ``AddRequest``, ``AbortRequest``, ``StepsRead`` and ``Stop``; the
child answers once with ``Loaded`` or ``Failed``, then with a ``Stepped`` for each step
that produced something. A step's outputs are ``RequestOutput`` dataclasses at both
ends and tuples of their fields on the wire (``Stepped.__reduce__``), as cheap as the
bare tuples that crossed before (``bench/pipe_messages.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

from shared.models import FinishReason
from worker.engine.config import EngineConfig
from worker.engine.input_processor import EngineShape
from worker.engine.outputs import RequestOutput
from worker.engine.request import EngineRequest


@dataclass(frozen=True, slots=True)
class AddRequest:
    request: EngineRequest


@dataclass(frozen=True, slots=True)
class AbortRequest:
    request_id: str
    reason: FinishReason


@dataclass(frozen=True, slots=True)
class StepsRead:
    """The worker has read this many more steps: the child may run as many more."""

    num_steps: int


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop once the step under way is sent."""


ToEngine = AddRequest | AbortRequest | StepsRead | Stop


@dataclass(frozen=True)
class Loaded:
    """What the worker reads of its engine once, when the child has loaded it."""

    config: EngineConfig
    device: str
    tokenizer_dir: str
    shape: EngineShape
    lora_rank_limit: int


@dataclass(frozen=True)
class Failed:
    reason: str
    load_error: bool  # a ModelLoadError: the worker prints it in one line


@dataclass(frozen=True, slots=True)
class Stepped:
    """One step's outputs, the engine's figures, and now and then the slow ones."""

    outputs: list[RequestOutput]
    stats: dict[str, float]
    warm: list[str] | None = None
    loras: list[str] | None = None

    def __reduce__(self) -> tuple[Callable[..., Stepped], tuple[Any, ...]]:
        # Its outputs cross as tuples of their fields: pickling a dataclass per row
        # costs its class lookup and field names each time; a tuple costs neither.
        rows = [_OUTPUT_FIELDS(out) for out in self.outputs]
        return _stepped, (rows, self.stats, self.warm, self.loras)


_OUTPUT_FIELDS = attrgetter(*(f.name for f in fields(RequestOutput)))


def _stepped(
    rows: list[tuple[Any, ...]],
    stats: dict[str, float],
    warm: list[str] | None,
    loras: list[str] | None,
) -> Stepped:
    """A ``Stepped`` as the pipe carried it (``Stepped.__reduce__``)."""
    return Stepped([RequestOutput(*row) for row in rows], stats, warm, loras)
