"""A response's streamed events, as a deterministic function of its record and its
request's stream entries.

Entries are read one at a time with the chat route's reply reader (reasoning, answer
text and tool calls apart; ``producer.openai.reply``), so the same entries give the same
events with the same sequence numbers on any gateway, on every replay: a client that
lost its connection asks for the events after the last sequence number it saw, and
gets each of the others exactly once, in order. The object a GET answers is the
builder's snapshot after the entries there are so far.

Events: ``response.created`` (and ``response.queued`` for a background response, whose
``response.in_progress`` waits for its first tokens), then per output item
``output_item.added``, its parts and deltas, their ``.done`` events and
``output_item.done``, and one terminal event: ``response.completed``,
``response.incomplete`` (``max_output_tokens``; ``timeout`` when a deadline stopped it),
``response.failed`` or ``response.cancelled``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

from producer.openai.output import Renderer
from producer.openai.reply import Delta
from producer.responses import objects
from producer.responses.objects import Item
from producer.responses.record import StoredResponse
from producer.streams.entries import Entry
from shared.models import FinalEvent, FinishReason

Event = dict[str, Any]


@dataclass
class _Open:
    """The output item being written: its index, kind and text so far."""

    index: int
    kind: Literal["message", "reasoning"]
    text: str = ""


class EventBuilder:
    """A response's events and object: ``opening()`` first, then ``feed()`` each stream
    entry in order; ``snapshot()`` at any point."""

    def __init__(self, record: StoredResponse) -> None:
        self.record = record
        self.renderer = Renderer(
            "chat",
            record.request_id,
            record.model,
            tools=record.tools_plan(),
            reasoning=record.think_plan(),
        )
        self.reader = self.renderer.new_reader()
        self.sequence_number = 0
        self.output: list[Item] = []
        self.open: _Open | None = None
        self.in_progress = False
        self.final: FinalEvent | None = None
        self.num_entries = 0

    # Events.
    def opening(self) -> list[Event]:
        """The events before any entry: created (and queued, in background)."""
        status = "queued" if self.record.background else "in_progress"
        events = [self._lifecycle("response.created", status)]
        if self.record.background:
            events.append(self._lifecycle("response.queued", status))
        else:
            events.append(self._started())
        return events

    def feed(self, entry: Entry) -> list[Event]:
        """The events one stream entry brings (none after the final one)."""
        if self.final is not None:
            return []
        self.num_entries += 1
        if entry.is_final:
            return self._finish(entry.final())
        events = [] if self.in_progress else [self._started()]
        self.renderer.add(entry)
        return events + self._delta(self.reader.feed(entry.text))

    def _started(self) -> Event:
        self.in_progress = True
        return self._lifecycle("response.in_progress", "in_progress")

    def _finish(self, final: FinalEvent) -> list[Event]:
        events = self._delta(self.reader.finish(final.finish_reason is FinishReason.LENGTH))
        status = objects.STATUSES[final.finish_reason]
        events += self._close("completed" if status == "completed" else "incomplete")
        self.final = final
        event = self._event(objects.TERMINAL_EVENTS[status], response=self.snapshot())
        return [*events, event]

    def _delta(self, delta: Delta) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning:
            events += self._text("reasoning", delta.reasoning)
        if delta.content:
            events += self._text("message", delta.content)
        for call in delta.calls:
            events += self._call(call)
        return events

    def _text(self, kind: Literal["message", "reasoning"], text: str) -> list[Event]:
        events = [] if self.open is not None and self.open.kind == kind else self._begin(kind)
        assert self.open is not None
        self.open.text += text
        self._set_text(self.output[self.open.index], self.open.text)
        where = self._where()
        if kind == "message":
            delta = self._event("response.output_text.delta", **where, delta=text, logprobs=[])
        else:
            delta = self._event("response.reasoning_text.delta", **where, delta=text)
        return [*events, delta]

    def _begin(self, kind: Literal["message", "reasoning"]) -> list[Event]:
        events = self._close("completed")
        index = len(self.output)
        item_id = f"{'msg' if kind == 'message' else 'rs'}_{self.record.request_id}_{index}"
        make = objects.message_item if kind == "message" else objects.reasoning_item
        self.output.append(make(item_id, None, "in_progress"))
        self.open = _Open(index, kind)
        part = objects.output_text("") if kind == "message" else objects.reasoning_text("")
        events.append(self._item_event("response.output_item.added", index))
        self.output[index]["content"] = [copy.deepcopy(part)]
        events.append(self._event("response.content_part.added", **self._where(), part=part))
        return events

    def _close(self, status: str) -> list[Event]:
        """The .done events of the item being written, if any."""
        if self.open is None:
            return []
        where, kind, text = self._where(), self.open.kind, self.open.text
        item = self.output[self.open.index]
        self.open = None
        item["status"] = status
        if kind == "message":
            done = self._event("response.output_text.done", **where, text=text, logprobs=[])
            part = objects.output_text(text)
        else:
            done = self._event("response.reasoning_text.done", **where, text=text)
            part = objects.reasoning_text(text)
        part_done = self._event("response.content_part.done", **where, part=part)
        return [
            done,
            part_done,
            self._item_event("response.output_item.done", where["output_index"]),
        ]

    def _call(self, call: dict[str, Any]) -> list[Event]:
        events = self._close("completed")
        index = len(self.output)
        arguments = call["function"]["arguments"]
        item_id = f"fc_{self.record.request_id}_{index}"
        self.output.append(objects.call_item(item_id, call, "", "in_progress"))
        events.append(self._item_event("response.output_item.added", index))
        where = {"item_id": item_id, "output_index": index}
        events.append(
            self._event("response.function_call_arguments.delta", **where, delta=arguments)
        )
        self.output[index].update(arguments=arguments, status="completed")
        events.append(self._event("response.function_call_arguments.done", **where,
                                  name=call["function"]["name"], arguments=arguments))  # fmt: skip
        events.append(self._item_event("response.output_item.done", index))
        return events

    def _where(self) -> dict[str, Any]:
        assert self.open is not None
        item_id = self.output[self.open.index]["id"]
        return {"item_id": item_id, "output_index": self.open.index, "content_index": 0}

    @staticmethod
    def _set_text(item: Item, text: str) -> None:
        item["content"][0]["text"] = text

    def _item_event(self, name: str, index: int) -> Event:
        return self._event(name, output_index=index, item=copy.deepcopy(self.output[index]))

    def _lifecycle(self, name: str, status: str) -> Event:
        return self._event(name, response=objects.response_object(self.record, status, []))

    def _event(self, kind: str, /, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event

    # The object.
    def snapshot(self, queued: bool = False) -> dict[str, Any]:
        """The response now: ended (once the final entry was fed), else in progress, or
        ``queued`` (what the request's state says) while no entry has come."""
        output = copy.deepcopy(self.output)
        if self.final is None:
            status = "queued" if queued and not self.num_entries else "in_progress"
            return objects.response_object(self.record, status, output)
        reasoning_tokens = self.renderer.reasoning_tokens(self.reader)
        status = objects.STATUSES[self.final.finish_reason]
        return objects.response_object(self.record, status, output, self.final, reasoning_tokens)


def build(record: StoredResponse, entries: list[Entry]) -> tuple[list[Event], EventBuilder]:
    """Every event ``entries`` (a stream from its start) give, and the builder after them."""
    builder = EventBuilder(record)
    events = builder.opening()
    for entry in entries:
        events += builder.feed(entry)
    return events, builder
