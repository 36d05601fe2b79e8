"""The worker's stream entries, built without the pydantic models on its hot path, are
byte for byte what it wrote through them: one step, coalesced steps, logprobs, any text."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from shared.models import FinishReason, GenerationRequest, TokenEvent
from worker.coalesce import merge, step_wire
from worker.engine.outputs import RequestOutput
from worker.held import Held
from worker.publisher import token_publish

TEXTS = ["Hi", " there", "日本", "é", "", '"quoted"\n\t\\', "\x00\x1f", "🙂👍🏽", "a" * 300]
# One step's output: its new token ids, its text, how many top logprobs (None: none
# asked for) and its finish reason.
Step = tuple[list[int], str, int | None, FinishReason | None]
STOP, LENGTH = FinishReason.STOP, FinishReason.LENGTH


def model_wire(event: TokenEvent) -> bytes:
    """What ``TokenEvent.wire`` wrote when it went through the model."""
    exclude = {"steps"} if event.steps is None else set()
    return orjson.dumps(event.model_dump(mode="json", exclude=exclude))


def logprob(token_id: int, num_top: int) -> dict[str, Any]:
    value = -0.25 * token_id - 1e-9
    top = [{"token_id": token_id + i, "logprob": value - i} for i in range(num_top)]
    return {"token_id": token_id, "logprob": value, "top": top}


def outputs(steps: list[Step], first_index: int = 5) -> list[RequestOutput]:
    """A request's consecutive step outputs, from token ``first_index`` on."""
    group, index = [], first_index
    for ids, text, num_top, reason in steps:
        logprobs = None if num_top is None else [logprob(t, num_top) for t in ids]
        group.append(RequestOutput("r", index, ids, text, reason, logprobs, 3, index + len(ids)))
        index += len(ids)
    return group


def model_event(group: list[RequestOutput]) -> TokenEvent:
    """The event the worker built for ``group`` through the models."""
    events = [
        TokenEvent(
            index=o.index,
            token_ids=tuple(o.new_token_ids),
            text=o.text,
            logprobs=tuple(o.logprobs) if o.logprobs else None,
        )
        for o in group
        if o.new_token_ids or o.text
    ]
    return TokenEvent.coalesce(events)


GROUPS: dict[str, list[Step]] = {
    "one step": [([5], "Hi", None, None)],
    "one step, logprobs": [([5], "Hi", 2, None)],
    "one step, no text": [([7], "", None, None)],
    "coalesced": [([i], t, None, None) for i, t in enumerate(TEXTS)],
    "coalesced, logprobs": [([i], t, i % 3, None) for i, t in enumerate(TEXTS)],
    "coalesced, logprobs on some steps": [([1], "a", 1, None), ([2], "b", None, None)],
    "coalesced, with the final": [([1], "x", None, None), ([], "", None, STOP)],
    "a token and the final": [([4], "z", 1, None), ([], "", None, LENGTH)],
    "text flushed with the last token": [([1], "ab", None, None), ([2], "c!", None, STOP)],
    "several tokens a step": [([1, 2, 3], "abc", 1, None), ([4, 5], "de", 1, None)],
}


@pytest.mark.parametrize("name", list(GROUPS))
def test_an_entry_is_what_the_models_wrote(name: str) -> None:
    group = outputs(GROUPS[name])
    expected = model_event(group)
    held = Held("r", "w:1", GenerationRequest(model="m", prompt="p"))
    publish = token_publish(held, merge(group))
    assert publish.event_json == model_wire(expected)
    assert (publish.index, publish.num_tokens) == (expected.index, len(expected.token_ids))


@pytest.mark.parametrize("name", list(GROUPS))
def test_a_merged_output_holds_every_steps_tokens_text_and_logprobs(name: str) -> None:
    group = outputs(GROUPS[name])
    merged, expected = merge(group), model_event(group)
    assert (merged.index, tuple(merged.new_token_ids), merged.text) == (
        expected.index,
        expected.token_ids,
        expected.text,
    )
    assert (None if merged.logprobs is None else tuple(merged.logprobs)) == expected.logprobs
    assert merged.finish_reason is group[-1].finish_reason
    assert TokenEvent.model_validate_json(step_wire(merged)).split() == expected.split()


@pytest.mark.parametrize("value", [0.0, -0.0, -1e-300, -123.456789012345678, float("-inf")])
def test_any_logprob_value_is_written_as_the_model_wrote_it(value: float) -> None:
    lp = {"token_id": 1, "logprob": value, "top": [{"token_id": 2, "logprob": value}]}
    event = TokenEvent(index=4, token_ids=(1,), text="t", logprobs=(lp,))
    assert event.wire() == model_wire(event)
    assert step_wire(RequestOutput("r", 4, [1], "t", None, [lp], 1, 5)) == model_wire(event)
