"""A chat reply read as it streams: reasoning, answer text and tool calls apart.

The same reader serves whole answers (fed once) and streams (fed per event), so a
streamed reply adds up to the whole one. Text that may be the start of a tag or of a
call is held until it is settled; each call is sent once it is complete. A reply cut
short (``finish_reason: "length"``) keeps its complete calls and drops the one it was
writing, never sending it as text.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass, field
from typing import Any

import orjson

from producer.openai.reasoning import ReasoningPlan, ReasoningSplitter
from producer.openai.tool_formats import Format, locate, parse_calls
from producer.openai.tools import ToolPlan

# Text that may complete a call; other deltas need no new look for calls.
_CALL_ENDS = ("}", ">", "]")
_ALNUM = string.ascii_letters + string.digits


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool_calls

    def __iadd__(self, other: Delta) -> Delta:
        self.reasoning += other.reasoning
        self.content += other.content
        self.calls.extend(other.calls)
        return self


def call_id(fmt: Format, key: str) -> str:
    """A call's id, the same for the same request, choice and call: ``call_<key>``, or
    for Mistral, whose template takes back only 9 letters and digits, 9 of them."""
    if fmt != "mistral":
        return f"call_{key}"
    digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest())
    return "".join(_ALNUM[(digest >> (6 * i)) % len(_ALNUM)] for i in range(9))


class CallReader:
    """The answer text with the tool calls of ``plan`` taken out."""

    def __init__(self, plan: ToolPlan, call_id_prefix: str) -> None:
        self.plan = plan
        self.prefix = call_id_prefix
        self.known = {f.name for f in plan.functions}
        self.text = ""
        self.sent = 0  # characters of text sent as content
        self.start: int | None = None  # where the calls begin
        self.never = False  # no call can begin any more
        self.calls: list[dict[str, Any]] = []

    def feed(self, text: str) -> Delta:
        self.text += text
        if self.start is None and not self.never:
            found = locate(self.plan.format, self.text)
            self.start, self.never = found.start, found.never
            if self.start is None:
                return self._content(found.safe)
        if self.start is None:
            return self._content(len(self.text))
        delta = self._content(self.start)
        if not delta.content.strip():
            delta.content = ""  # the whitespace before calls is no answer
        if any(end in text for end in _CALL_ENDS):
            delta.calls = self._new_calls(final=False)
        return delta

    def finish(self, cut_off: bool) -> Delta:
        if self.start is None:
            return self._content(len(self.text))
        delta = Delta(calls=self._new_calls(final=True))
        if not self.calls and not cut_off:
            delta.content = self.text[self.sent :]  # not calls after all: it was text
        return delta

    def _content(self, end: int) -> Delta:
        content, self.sent = self.text[self.sent : end], max(self.sent, end)
        return Delta(content=content)

    def _new_calls(self, final: bool) -> list[dict[str, Any]]:
        assert self.start is not None
        found = parse_calls(self.plan.format, self.text[self.start :], final)
        known = [c for c in found if c["name"] in self.known]
        new = [
            self._numbered(c, len(self.calls) + i) for i, c in enumerate(known[len(self.calls) :])
        ]
        self.calls.extend(new)
        return new

    def _numbered(self, call: dict[str, Any], index: int) -> dict[str, Any]:
        arguments = orjson.dumps(call["arguments"]).decode()
        return {
            "id": call_id(self.plan.format, f"{self.prefix}_{index}"),
            "type": "function",
            "function": {"name": call["name"], "arguments": arguments},
        }


class ReplyReader:
    """Reasoning first (when the model has think tags), then the answer, with the tool
    calls taken out of it (when tools are in play)."""

    def __init__(
        self, tools: ToolPlan | None, reasoning: ReasoningPlan | None, call_id_prefix: str
    ) -> None:
        self.thinking = None if reasoning is None else ReasoningSplitter(reasoning)
        active = tools is not None and tools.active
        self.calling = CallReader(tools, call_id_prefix) if active and tools else None

    def feed(self, text: str) -> Delta:
        reasoning, answer = ("", text) if self.thinking is None else self.thinking.feed(text)
        delta = self._answer(answer)
        delta.reasoning = reasoning
        return delta

    def finish(self, cut_off: bool) -> Delta:
        reasoning, answer = ("", "") if self.thinking is None else self.thinking.finish()
        delta = self._answer(answer)
        delta.reasoning = reasoning
        if self.calling is not None:
            delta += self.calling.finish(cut_off)
        return delta

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [] if self.calling is None else self.calling.calls

    def reasoning_end(self) -> int | None:
        """Characters of the reply up to the end of its reasoning (all of it while the
        model is still reasoning); None for a reply without reasoning."""
        if self.thinking is None:
            return None
        if self.thinking.in_reasoning:
            return self.thinking.consumed + len(self.thinking.pending)
        return self.thinking.end_at

    def _answer(self, text: str) -> Delta:
        if self.calling is None:
            return Delta(content=text)
        return self.calling.feed(text) if text else Delta()
