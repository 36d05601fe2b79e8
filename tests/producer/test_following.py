"""A reader's view of a stream across a failover: tokens it already had, written again
because the new primary lacked them, are not handed to it twice."""

from __future__ import annotations

from producer.following import Unrepeated
from producer.streams.entries import UnrepeatedEntries, parse_entry, token_span
from shared.models import FinalEvent, FinishReason, StreamEvent, TokenEvent, dumps


def _event(index: int, n: int) -> TokenEvent:
    steps = [TokenEvent(index=i, token_ids=(i,), text=f"t{i} ") for i in range(index, index + n)]
    return TokenEvent.coalesce(steps)


def _stream(*events: TokenEvent | FinalEvent) -> list[StreamEvent]:
    return [StreamEvent(id=f"{n + 1}-0", event=e) for n, e in enumerate(events)]


def test_tokens_written_again_after_a_failover_reach_a_reader_once() -> None:
    reader = Unrepeated()
    seen = reader.events(_stream(_event(0, 3), _event(3, 3)))  # from the old primary
    # The new primary had tokens 0-3; the worker wrote 4 onwards again, in other entries.
    seen += reader.events(
        _stream(_event(4, 1), _event(5, 3), FinalEvent(finish_reason=FinishReason.LENGTH))
    )
    tokens = [t for e in seen if isinstance(e.event, TokenEvent) for t in e.event.token_ids]
    assert tokens == list(range(8))
    texts = "".join(e.event.text for e in seen if isinstance(e.event, TokenEvent))
    assert texts == "".join(f"t{i} " for i in range(8))
    assert isinstance(seen[-1].event, FinalEvent)


def test_a_reader_that_resumes_mid_stream_takes_its_first_event_as_it_comes() -> None:
    reader = Unrepeated()
    assert reader.events(_stream(_event(5, 2))) == _stream(_event(5, 2))


def test_the_gateway_sends_what_a_client_had_once() -> None:
    entries = [parse_entry(f"{n}-0", {b"e": dumps(e)}) for n, e in
               enumerate([_event(0, 3), _event(3, 2), _event(2, 4)], 1)]  # fmt: skip
    assert [token_span(e) for e in entries] == [(0, 3), (3, 2), (2, 4)]
    sent = UnrepeatedEntries().entries(entries)
    assert [e.token().token_ids for e in sent] == [(0, 1, 2), (3, 4), (5,)]
    assert sent[-1].token().text == "t5 "
