"""A worker's error for one request, read as the request's fault or the service's.

A worker ends a request with ``finish_reason: error`` when it cannot run it: a prompt
past the context, a token id outside the vocabulary, a schema or regex that does not
compile, a grammar past its time limit. Those are the client's mistakes: the final
event carries them as a typed ``refusal`` (code, native field, message), decided where
the worker refused, and they answer 400 naming the field, so no client retries them.
The service's own failures (a request dead-lettered after its workers were lost, a
payload a worker could not read, an error a worker reports as its own) carry no
refusal and answer 500.

A final written by a worker from before refusals were typed has only its ``error``
sentence; ``legacy_refusal`` reads that, and nothing else does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from shared.models import FinishReason, GenerationRequest, SamplingParams
from shared.refusal import REFUSED
from shared.refusal import Refusal as WireRefusal

SERVICE_ERRORS = ("worker lost", "unreadable payload", "internal error")
SAMPLING_FIELDS = frozenset(SamplingParams.model_fields)


class Ended(Protocol):
    """A final event or a result: how a request ended."""

    @property
    def finish_reason(self) -> FinishReason: ...

    @property
    def error(self) -> str | None: ...

    @property
    def refusal(self) -> WireRefusal | None: ...


@dataclass(frozen=True)
class Refusal:
    """Why a worker refused a request; ``param`` is the native field it names."""

    message: str
    param: str | None
    code: str = "invalid_value"

    def param_in(self, names: Mapping[str, str]) -> str | None:
        """``param`` as an API spells it (``names`` maps native names to its own)."""
        return None if self.param is None else names.get(self.param, self.param)

    @classmethod
    def of(cls, refusal: WireRefusal) -> Refusal:
        return cls(refusal.message, refusal.param, refusal.code.value)


def refusal_of(final: Ended) -> Refusal | None:
    """The client's mistake a failed request ended with; None for anything else."""
    if final.finish_reason is not FinishReason.ERROR:
        return None
    if final.refusal is not None:
        return Refusal.of(final.refusal)
    return legacy_refusal(final.error or "")


# A final of an older worker: its sentence is all there is to go by.
_PREFIXES = re.compile(r"^(cannot run this request: )?(request \S+: )?")
_CONTEXT = re.compile(
    r"(\d+) prompt tokens and max_tokens \d+ need \d+ tokens of context, over the (\d+)"
)
_FIELDS = tuple(
    sorted({*SamplingParams.model_fields, *GenerationRequest.model_fields}, key=len, reverse=True)
)
_FIELD = re.compile(r"\b(" + "|".join(_FIELDS) + r")\b")


def legacy_refusal(error: str) -> Refusal | None:
    """The refusal in an older worker's error sentence (it carried no ``refusal``):
    its words "cannot run this request", or a field of the request it names."""
    if error.lower().startswith(SERVICE_ERRORS):
        return None
    message = _PREFIXES.sub("", error) or "the worker refused this request"
    param, code = _legacy_field_of(message)
    if param is None and not error.startswith(REFUSED):
        return None
    return Refusal(message, param, code)


def _legacy_field_of(message: str) -> tuple[str | None, str]:
    context = _CONTEXT.search(message)
    if context is not None:
        num_prompt, limit = int(context.group(1)), int(context.group(2))
        return ("prompt" if num_prompt >= limit else "max_tokens"), "context_length_exceeded"
    if "text to embed" in message:
        return "prompt", "context_length_exceeded"
    if "LoRA" in message or "adapter" in message:
        return "lora", "invalid_value"
    found = _FIELD.search(message)
    return (None if found is None else found.group(1)), "invalid_value"
