"""A final that carries a typed refusal is read from its fields, never from its
sentence; only a final of an older worker (no fields) goes by the words."""

from __future__ import annotations

import pytest

from producer import refusals
from producer.refusals import refusal_of
from shared.models import FinalEvent, FinishReason, Result, Timings, Usage
from shared.refusal import Refusal, RefusalCode

# A sentence that would mislead any reading of it: it names other fields.
MISLEADING = "prompt_token_ids and logit_bias: 9000 prompt tokens and max_tokens 1 need 9001 "


def typed(code: RefusalCode, param: str | None) -> FinalEvent:
    refusal = Refusal(code=code, param=param, message=MISLEADING)
    return FinalEvent(finish_reason=FinishReason.ERROR, error=refusal.error_text, refusal=refusal)


@pytest.fixture
def no_sentence_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(error: str) -> None:
        raise AssertionError(f"read a sentence: {error!r}")

    monkeypatch.setattr(refusals, "legacy_refusal", refuse)


@pytest.mark.parametrize(
    ("code", "param"),
    [
        (RefusalCode.CONTEXT_LENGTH_EXCEEDED, "max_tokens"),
        (RefusalCode.INVALID_VALUE, "guided_json"),
        (RefusalCode.INVALID_VALUE, None),
    ],
)
@pytest.mark.usefixtures("no_sentence_reading")
def test_a_typed_refusal_is_read_from_its_fields(code: RefusalCode, param: str | None) -> None:
    shown = refusal_of(typed(code, param))
    assert shown is not None
    assert (shown.code, shown.param, shown.message) == (code.value, param, MISLEADING)


@pytest.mark.usefixtures("no_sentence_reading")
def test_a_result_carries_the_refusal_of_its_final() -> None:
    final = typed(RefusalCode.INVALID_VALUE, "lora")
    result = Result(
        id="r",
        model="m",
        text="",
        token_ids=(),
        finish_reason=final.finish_reason,
        usage=Usage(),
        timings=Timings(),
        error=final.error,
        refusal=final.refusal,
    )
    shown = refusal_of(result)
    assert shown is not None and shown.param == "lora"


def test_the_services_failures_carry_no_refusal_and_are_not_refusals() -> None:
    lost = FinalEvent(finish_reason=FinishReason.ERROR, error="worker lost 3 times (last: w1)")
    assert lost.refusal is None and refusal_of(lost) is None


def test_a_final_of_an_older_worker_is_still_understood() -> None:
    old = FinalEvent(
        finish_reason=FinishReason.ERROR,
        error="cannot run this request: request r1: stop_token_ids token id 99999 is not in "
        "this model's vocabulary of 49152 tokens",
    )
    shown = refusal_of(old)
    assert shown is not None and (shown.param, shown.code) == ("stop_token_ids", "invalid_value")
