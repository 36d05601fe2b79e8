"""A refusal as data: why a request will not run, decided where it is refused.

A submit that reads the registered limits (``shared.limits``) and a worker that cannot
run a request (its engine, chat template, grammar or adapter registry) raise
``RequestRefused``; the worker writes its ``Refusal`` into the request's final event,
so whoever shows it (the gateway's 400, a client's ``Result``) reads the code and the
field at fault from there, never from the sentence.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from shared.errors import InvalidRequest

# What a worker's error text starts with when it refused the request (the request's
# fault, not the service's): readers from before ``Refusal`` went by these words.
REFUSED = "cannot run this request"


class RefusalCode(StrEnum):
    """What kind of mistake the request holds (the ``code`` of an API's error body)."""

    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # prompt + max_tokens past the context
    INVALID_VALUE = "invalid_value"  # a field the model or worker cannot take as given


class Refusal(BaseModel):
    """Why a request will not run: ``param`` is the native field at fault (``prompt``,
    ``prompt_token_ids``, ``max_tokens``, ``logit_bias``, ``lora``, ``guided_json``...;
    a sampling field by its own name), None when no one field is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: RefusalCode
    param: str | None = None
    message: str = Field(description="what was wrong and what to do, for a person")

    @property
    def error_text(self) -> str:
        """The final event's ``error`` for this refusal (for people and older readers)."""
        return f"{REFUSED}: {self.message}"


class RequestRefused(InvalidRequest):
    """The request's own mistake, as a typed ``Refusal`` (still a ValueError, as the
    untyped refusals it replaces were)."""

    def __init__(self, code: RefusalCode, param: str | None, message: str) -> None:
        super().__init__(message)
        self.refusal = Refusal(code=code, param=param, message=message)


def invalid(param: str | None, message: str) -> RequestRefused:
    """A field the model or worker cannot take as given."""
    return RequestRefused(RefusalCode.INVALID_VALUE, param, message)


def too_long(param: str, message: str) -> RequestRefused:
    """A prompt (with its max_tokens) past the context."""
    return RequestRefused(RefusalCode.CONTEXT_LENGTH_EXCEEDED, param, message)
