"""A worker's error for one request: the client's mistake (400 naming the field) or
the service's own failure (500)."""

from __future__ import annotations

import pytest

from producer.refusals import Refusal, refusal_of
from shared.models import FinalEvent, FinishReason

CONTEXT = (
    "cannot run this request: request r1: {p} prompt tokens and max_tokens {m} need "
    "{n} tokens of context, over the 8192 that the model takes (its max_model_len); "
    "shorten the prompt or lower max_tokens"
)


def failed(error: str | None, reason: FinishReason = FinishReason.ERROR) -> FinalEvent:
    return FinalEvent(finish_reason=reason, error=error)


@pytest.mark.parametrize(
    ("error", "param", "code"),
    [
        (CONTEXT.format(p=9000, m=16, n=9016), "prompt", "context_length_exceeded"),
        (CONTEXT.format(p=100, m=9000, n=9100), "max_tokens", "context_length_exceeded"),
        (
            "cannot run this request: request r1: logit_bias token id 999999 is not in "
            "this model's vocabulary of 49152 tokens",
            "logit_bias",
            "invalid_value",
        ),
        (
            "guided_regex: cannot be used for constrained decoding: Lookbehind is not supported",
            "guided_regex",
            "invalid_value",
        ),
        (
            "cannot run this request: guided_json: cannot be used for constrained decoding: x",
            "guided_json",
            "invalid_value",
        ),
        (
            "cannot run this request: prompt_token_ids[3] is 70000, outside the model's "
            "vocabulary of 49152 tokens (ids 0..49151)",
            "prompt_token_ids",
            "invalid_value",
        ),
        (
            "cannot run this request: LoRA adapter 'a' is no longer registered for model 'm'",
            "lora",
            "invalid_value",
        ),
        ("cannot run this request: something odd", None, "invalid_value"),
    ],
)
def test_what_the_worker_refused_is_the_requests_fault(
    error: str, param: str | None, code: str
) -> None:
    refusal = refusal_of(failed(error))
    assert refusal is not None
    assert (refusal.param, refusal.code) == (param, code)
    assert not refusal.message.startswith("cannot run this request")
    assert not refusal.message.startswith("request r1")


@pytest.mark.parametrize(
    "error",
    [
        "worker lost 3 times (last: w1)",
        "unreadable payload: 1 validation error",
        "internal error while sampling: IndexError",
        "CUDA fell over",
    ],
)
def test_the_services_own_failures_are_not_refusals(error: str) -> None:
    assert refusal_of(failed(error)) is None


def test_only_errors_are_refusals() -> None:
    assert refusal_of(failed(None, FinishReason.STOP)) is None
    assert refusal_of(failed("late", FinishReason.EXPIRED)) is None


def test_an_api_spells_the_param_its_own_way() -> None:
    refusal = Refusal("too long", "prompt")
    assert refusal.param_in({"prompt": "messages"}) == "messages"
    assert refusal.param_in({}) == "prompt"
    assert Refusal("x", None).param_in({"prompt": "input"}) is None
