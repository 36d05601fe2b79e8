"""A worker's error for one request, read as the request's fault or the service's.

A worker ends a request with ``finish_reason: error`` and a message when it cannot run
that request: a prompt past the context, a token id outside the vocabulary, a schema or
regex that does not compile, a grammar past its time limit. Those are the client's
mistakes and answer 400 naming the field, so no client retries them: the message says
"cannot run this request", or names a field of the request. The service's own
failures answer 500: a request dead-lettered after its workers were lost, a payload a
worker could not read, an error a worker reports as its own (a message starting
"internal error"), and any other message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from shared.models import FinishReason, GenerationRequest, SamplingParams

SERVICE_ERRORS = ("worker lost", "unreadable payload", "internal error")
REFUSED = "cannot run this request"  # the worker's words for a request it will not run
_PREFIXES = re.compile(r"^(cannot run this request: )?(request \S+: )?")
_CONTEXT = re.compile(
    r"(\d+) prompt tokens and max_tokens \d+ need \d+ tokens of context, over the (\d+)"
)
_FIELDS = tuple(
    sorted({*SamplingParams.model_fields, *GenerationRequest.model_fields}, key=len, reverse=True)
)
SAMPLING_FIELDS = frozenset(SamplingParams.model_fields)
_FIELD = re.compile(r"\b(" + "|".join(_FIELDS) + r")\b")


class Ended(Protocol):
    """A final event or a result: how a request ended."""

    @property
    def finish_reason(self) -> FinishReason: ...

    @property
    def error(self) -> str | None: ...


@dataclass(frozen=True)
class Refusal:
    """Why a worker refused a request; ``param`` is the native field it names."""

    message: str
    param: str | None
    code: str = "invalid_value"

    def param_in(self, names: Mapping[str, str]) -> str | None:
        """``param`` as an API spells it (``names`` maps native names to its own)."""
        return None if self.param is None else names.get(self.param, self.param)


def refusal_of(final: Ended) -> Refusal | None:
    """The client's mistake a failed request ended with; None for anything else."""
    if final.finish_reason is not FinishReason.ERROR:
        return None
    error = final.error or ""
    if error.lower().startswith(SERVICE_ERRORS):
        return None
    message = _PREFIXES.sub("", error) or "the worker refused this request"
    param, code = _field_of(message)
    if param is None and not error.startswith(REFUSED):
        return None
    return Refusal(message, param, code)


def _field_of(message: str) -> tuple[str | None, str]:
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
