"""A batch's input lines as parsed (``bodies`` reads them from the JSONL file): each
line's request, or the refusal the live route would have answered, and how to render
its answer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from producer.openai.reasoning import ReasoningPlan
from producer.openai.tools import ToolPlan
from shared.errors import InvalidRequest
from shared.models import GenerationRequest

Kind = Literal["chat", "completion", "embedding", "response"]
MAX_REPORTED_ERRORS = 10


class BatchInputError(InvalidRequest):
    """The batch file has bad lines; the message lists them by line number."""

    def __init__(self, problems: list[str]) -> None:
        shown = "; ".join(problems[:MAX_REPORTED_ERRORS])
        more = len(problems) - MAX_REPORTED_ERRORS
        suffix = f"; and {more} more" if more > 0 else ""
        super().__init__(f"batch input has {len(problems)} bad line(s): {shown}{suffix}")
        self.problems = problems


@dataclass(frozen=True)
class LineError:
    """What a live call with the line's body would answer: its status and error object."""

    message: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"
    status: int = 400


@dataclass(frozen=True)
class BatchLine:
    """One input line: choice 0's request (the driver sends ``n``, seeds seed + i), the
    tool and reasoning plans its answer is read with (and for a ``/v1/responses`` line its
    response record), or, for a refused line, the error instead."""

    custom_id: str
    kind: Kind
    request: GenerationRequest | None
    n: int = 1
    tools: ToolPlan | None = None
    logprobs: bool = False
    error: LineError | None = None
    reasoning: ReasoningPlan | None = None
    response: dict[str, Any] | None = None  # producer.responses.record.StoredResponse

    def to_json(self) -> bytes:
        request = None if self.request is None else self.request.model_dump(mode="json")
        line = {
            "custom_id": self.custom_id,
            "kind": self.kind,
            "request": request,
            "n": self.n,
            "tools": None if self.tools is None else self.tools.to_dict(),
            "logprobs": self.logprobs,
            "error": None if self.error is None else dataclasses.asdict(self.error),
            "reasoning": None if self.reasoning is None else self.reasoning.to_dict(),
            "response": self.response,
        }
        return orjson.dumps(line)

    @classmethod
    def from_json(cls, data: bytes | str) -> BatchLine:
        raw: dict[str, Any] = orjson.loads(data)
        request, tools, error = raw.get("request"), raw.get("tools"), raw.get("error")
        reasoning = raw.get("reasoning")
        return cls(
            raw["custom_id"],
            raw["kind"],
            None if request is None else GenerationRequest.model_validate(request),
            int(raw.get("n", 1)),
            None if tools is None else ToolPlan.from_dict(tools),
            bool(raw.get("logprobs")),
            None if error is None else LineError(**error),
            None if reasoning is None else ReasoningPlan.from_dict(reasoning),
            raw.get("response"),
        )
