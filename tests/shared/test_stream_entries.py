"""Stream entries as readers parse them: single-step entries (what workers wrote before
coalescing, and still write with it off) and coalesced ones."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from producer.openai.answers import token_logprobs
from producer.streams.entries import parse_entry
from shared.models import TokenEvent
from shared.reads import parse_xread

OLD_ENTRY = b'{"type":"token","index":3,"token_ids":[7],"text":"a","logprobs":null}'


def xread_reply(*entries: bytes) -> list[object]:
    stream = [(f"1700000000000-{i}".encode(), {b"e": data}) for i, data in enumerate(entries)]
    return [[b"tokenq:{x}:stream:r", stream]]


def step(index: int, ids: list[int], text: str, logprob: float | None = None) -> TokenEvent:
    logprobs = None
    if logprob is not None:
        logprobs = tuple({"token_id": t, "logprob": logprob, "top": []} for t in ids)
    return TokenEvent(index=index, token_ids=tuple(ids), text=text, logprobs=logprobs)


def test_an_entry_written_before_coalescing_reads_as_one_step() -> None:
    (event,) = parse_xread(xread_reply(OLD_ENTRY))
    assert isinstance(event.event, TokenEvent)
    assert (event.event.index, event.event.token_ids, event.event.text) == (3, (7,), "a")
    assert event.event.split() == [event.event]


def test_a_coalesced_entry_splits_into_its_steps_with_their_indexes() -> None:
    steps = [step(5, [1], "日"), step(6, [2, 3], "本é"), step(8, [4], ""), step(9, [5], "!")]
    written = TokenEvent.coalesce(steps).wire()
    single = step(10, [6], "?").wire()
    first, second = parse_xread(xread_reply(written, single))
    assert isinstance(first.event, TokenEvent) and isinstance(second.event, TokenEvent)
    assert (first.event.index, first.event.token_ids, first.event.text) == (
        5,
        (1, 2, 3, 4, 5),
        "日本é!",
    )
    assert first.event.split() == steps
    assert second.event.split() == [step(10, [6], "?")]
    assert b"steps" not in single  # readers from before coalescing still read it


def test_logprobs_stay_with_their_steps_tokens() -> None:
    steps = [step(0, [11], "Hi", -0.5), step(1, [12], " there", -1.5)]
    entry = parse_entry("1-0", [b"e", TokenEvent.coalesce(steps).wire()])
    named = [(lp.token, lp.logprob) for lp in token_logprobs(entry.token())]
    assert named == [("Hi", -0.5), (" there", -1.5)]


def test_a_coalesced_entry_whose_steps_do_not_cover_it_is_refused() -> None:
    data = orjson.loads(TokenEvent.coalesce([step(0, [1], "a"), step(1, [2], "b")]).wire())
    data["steps"] = [[1, 1], [2, 1]]
    with pytest.raises(ValidationError, match=r"steps .* cover 3 tokens and 2 characters"):
        parse_xread(xread_reply(orjson.dumps(data)))
