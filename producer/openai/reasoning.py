"""A reasoning model's reply split into its reasoning (between its think tags) and the
answer after it, as the reply streams in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from producer.openai.tool_formats import partial_suffix

State = Literal["start", "thinking", "answer"]


@dataclass(frozen=True)
class ReasoningPlan:
    """The model's think tags, and whether the reply begins inside a think block (its
    prompt opened one)."""

    start: str
    end: str
    opened: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "opened": self.opened}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReasoningPlan:
        return cls(str(data["start"]), str(data["end"]), bool(data.get("opened")))


class ReasoningSplitter:
    """Feed the reply's text as it comes; each feed returns (reasoning, answer) text that
    is settled. A reply that does not begin with the start tag (after whitespace) has no
    reasoning, unless its prompt opened the block."""

    def __init__(self, plan: ReasoningPlan) -> None:
        self.plan = plan
        self.state: State = "thinking" if plan.opened else "start"
        self.pending = ""  # text not settled yet (a tag may be arriving)
        self.consumed = 0  # characters of the reply settled so far
        self.end_at: int | None = None  # where the reasoning ended, its end tag included
        self._trim = False  # drop the whitespace the model puts after its end tag

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        if self.state == "start":
            self._open()
        if self.state == "thinking":
            return self._think()
        if self.state == "answer":
            return "", self._answer()
        return "", ""

    def finish(self) -> tuple[str, str]:
        """What is still held: reasoning cut short, or an answer that looked like a tag."""
        rest, self.pending = self.pending, ""
        self.consumed += len(rest)
        return (
            (rest, "") if self.state == "thinking" else ("", rest.lstrip() if self._trim else rest)
        )

    @property
    def in_reasoning(self) -> bool:
        return self.state == "thinking"

    def _open(self) -> None:
        stripped = self.pending.lstrip()
        if stripped.startswith(self.plan.start):
            self._settle(len(self.pending) - len(stripped) + len(self.plan.start))
            self.state = "thinking"
        elif not self.plan.start.startswith(stripped):
            self.state = "answer"

    def _think(self) -> tuple[str, str]:
        at = self.pending.find(self.plan.end)
        if at < 0:
            keep = partial_suffix(self.pending, self.plan.end)
            return self._settle(len(self.pending) - keep), ""
        reasoning = self._settle(at)
        self._settle(len(self.plan.end))
        self.end_at, self.state, self._trim = self.consumed, "answer", True
        return reasoning, self._answer()

    def _answer(self) -> str:
        if self._trim:
            self._settle(len(self.pending) - len(self.pending.lstrip()))
            self._trim = not self.pending
        return self._settle(len(self.pending))

    def _settle(self, size: int) -> str:
        settled, self.pending = self.pending[:size], self.pending[size:]
        self.consumed += size
        return settled
