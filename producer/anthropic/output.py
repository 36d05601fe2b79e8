"""tokenq stream events to Anthropic Messages: the whole message, and the stream's
events (``message_start``, ``ping``, per block ``content_block_start`` /
``content_block_delta`` / ``content_block_stop``, then ``message_delta`` with the stop
reason and usage, and ``message_stop``).

The reply is read by the chat route's ``ReplyReader`` (reasoning, text and tool calls
apart); its pieces become thinking, text and tool_use blocks in the order they come. A
streamed message and the whole one are built by the same ``Blocks``, so the deltas of a
stream join to the whole message's content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from producer.anthropic.errors import anthropic_error
from producer.gateway.sse import frame
from producer.openai.errors import ApiError
from producer.openai.output import failure as chat_failure
from producer.openai.reasoning import ReasoningPlan
from producer.openai.reply import Delta, ReplyReader
from producer.openai.tools import ToolPlan
from producer.streams.entries import Entry
from shared.models import FinalEvent, FinishReason


def event(kind: str, data: dict[str, Any]) -> bytes:
    """One SSE event, named by its type as Anthropic's are."""
    return frame(orjson.dumps({"type": kind, **data}), event=kind)


@dataclass
class Blocks:
    """The message's content blocks as the reply's pieces arrive, and the stream events
    that build them."""

    blocks: list[dict[str, Any]] = field(default_factory=list)
    open_kind: str | None = None  # the kind of the last block while it may grow

    def add(self, delta: Delta) -> bytes:
        out = b""
        if delta.reasoning:
            out += self._grow("thinking", delta.reasoning)
        if delta.content:
            out += self._grow("text", delta.content)
        for call in delta.calls:
            out += self._tool_use(call)
        return out

    def close(self) -> bytes:
        """The open block's end; a message with no block gets an empty text block."""
        if not self.blocks:
            self.blocks.append({"type": "text", "text": ""})
            start = {"index": 0, "content_block": {"type": "text", "text": ""}}
            return event("content_block_start", start) + self._stop()
        return self._stop() if self.open_kind is not None else b""

    def _grow(self, kind: str, text: str) -> bytes:
        out = b""
        if self.open_kind != kind:
            out += self._stop() if self.open_kind is not None else b""
            empty = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" \
                else {"type": "text", "text": ""}  # fmt: skip
            self.blocks.append(empty)
            self.open_kind = kind
            out += event("content_block_start", {"index": self._index, "content_block": empty})
        self.blocks[-1][kind] += text
        delta = {"type": f"{kind}_delta", kind: text}
        return out + event("content_block_delta", {"index": self._index, "delta": delta})

    def _tool_use(self, call: dict[str, Any]) -> bytes:
        out = self._stop() if self.open_kind is not None else b""
        function = call["function"]
        arguments = function["arguments"]
        block = {"type": "tool_use", "id": call["id"], "name": function["name"], "input": {}}
        self.blocks.append(block)
        start = {"index": self._index, "content_block": dict(block)}
        block["input"] = orjson.loads(arguments)
        delta = {"type": "input_json_delta", "partial_json": arguments}
        out += event("content_block_start", start)
        out += event("content_block_delta", {"index": self._index, "delta": delta})
        return out + event("content_block_stop", {"index": self._index})

    def _stop(self) -> bytes:
        self.open_kind = None
        return event("content_block_stop", {"index": self._index})

    @property
    def _index(self) -> int:
        return len(self.blocks) - 1


@dataclass
class MessageRenderer:
    """One message's events, rendered the Anthropic way."""

    request_id: str
    model: str
    tools: ToolPlan | None = None
    reasoning: ReasoningPlan | None = None
    blocks: Blocks = field(default_factory=Blocks)
    reader: ReplyReader | None = None

    @property
    def id(self) -> str:
        return "msg_" + self.request_id

    def start(self) -> bytes:
        """``message_start`` (the prompt's tokens are known at the end: message_delta
        carries them) and a ``ping``."""
        message: dict[str, Any] = {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }  # fmt: skip
        return event("message_start", {"message": message}) + event("ping", {})

    def feed(self, entry: Entry) -> bytes:
        return self.blocks.add(self._reader().feed(entry.text))

    def render(self, batch: list[Entry]) -> tuple[bytes, FinalEvent | None]:
        """The events for a batch of entries, and its final event if it has one."""
        out = b""
        for entry in batch:
            if entry.is_final:
                final = entry.final()
                return out + self.end(final), final
            out += self.feed(entry)
        return out, None

    def end(self, final: FinalEvent) -> bytes:
        """What the reader held, the last block's end, ``message_delta`` and
        ``message_stop``; an ``error`` event instead for a request that failed."""
        error = failure(final)
        if error is not None:
            return error_event(error)
        out = self.blocks.add(self._reader().finish(final.finish_reason is FinishReason.LENGTH))
        out += self.blocks.close()
        delta = {"stop_reason": self.stop_reason(final), "stop_sequence": final.stop_sequence}
        usage = {
            "input_tokens": final.usage.prompt_tokens,
            "output_tokens": final.usage.completion_tokens,
        }
        return (
            out
            + event("message_delta", {"delta": delta, "usage": usage})
            + event("message_stop", {})
        )

    def stop_reason(self, final: FinalEvent) -> str:
        if final.finish_reason is FinishReason.LENGTH:
            return "max_tokens"
        if any(b["type"] == "tool_use" for b in self.blocks.blocks):
            return "tool_use"
        return "end_turn" if final.stop_sequence is None else "stop_sequence"

    def message(self, final: FinalEvent) -> dict[str, Any]:
        """The whole message, once its events were fed and ``end`` rendered."""
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.blocks.blocks,
            "stop_reason": self.stop_reason(final),
            "stop_sequence": final.stop_sequence,
            "usage": {
                "input_tokens": final.usage.prompt_tokens,
                "output_tokens": final.usage.completion_tokens,
            },
        }

    def _reader(self) -> ReplyReader:
        if self.reader is None:
            self.reader = ReplyReader(self.tools, self.reasoning, f"{self.request_id}_0")
        return self.reader


def failure(final: FinalEvent) -> ApiError | None:
    """The error of a request that produced no message (the chat route's, with its
    field names: Anthropic's are the same)."""
    return chat_failure(final, "chat")


def error_event(error: ApiError) -> bytes:
    return event("error", {"error": anthropic_error(error.status, error.detail)["error"]})
