"""Batch input: JSONL lines in OpenAI's batch format (or plain bodies) to tokenq requests.

A line is ``{"custom_id", "method": "POST", "url": "/v1/chat/completions" |
"/v1/completions" | "/v1/embeddings", "body": {...}}``; ``url`` and ``method`` may be
left out (the body's ``messages``, ``prompt`` or ``input`` says which), and so may
``body`` (the rest of the line is the body). An embeddings line embeds one text.

A line that cannot be told apart from the others (not JSON, no custom_id or one used
twice, an unknown url) refuses the whole file with BatchInputError, and nothing is
queued. A line whose body the live route would refuse is kept with that refusal: the
batch runs its other lines and writes the refusal to its error file (``bodies``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from producer.tools import ToolPlan
from shared.errors import InvalidRequest
from shared.models import GenerationRequest
from shared.settings import Settings

Kind = Literal["chat", "completion", "embedding"]
URL_KINDS: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
}
BODY_KINDS: tuple[tuple[str, Kind], ...] = (
    ("messages", "chat"),
    ("prompt", "completion"),
    ("input", "embedding"),
)
MAX_CUSTOM_ID_CHARS = 200
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
    tool plan its answer is rendered with, or, for a refused line, the error instead."""

    custom_id: str
    kind: Kind
    request: GenerationRequest | None
    n: int = 1
    tools: ToolPlan | None = None
    logprobs: bool = False
    error: LineError | None = None

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
        }
        return orjson.dumps(line)

    @classmethod
    def from_json(cls, data: bytes | str) -> BatchLine:
        raw: dict[str, Any] = orjson.loads(data)
        request, tools, error = raw.get("request"), raw.get("tools"), raw.get("error")
        return cls(
            raw["custom_id"],
            raw["kind"],
            None if request is None else GenerationRequest.model_validate(request),
            int(raw.get("n", 1)),
            None if tools is None else ToolPlan.from_dict(tools),
            bool(raw.get("logprobs")),
            None if error is None else LineError(**error),
        )


def parse_jsonl(
    text: str | bytes, settings: Settings, *, model: str | None = None, max_lines: int = 50_000
) -> list[BatchLine]:
    """Every non-blank line parsed; raises BatchInputError naming the lines it cannot
    tell apart. Lines with bad bodies come back with their ``error``."""
    raw = text.decode() if isinstance(text, bytes) else text
    numbered = [(n, s) for n, s in enumerate(raw.splitlines(), 1) if s.strip()]
    if not numbered:
        raise BatchInputError(["the file has no lines"])
    if len(numbered) > max_lines:
        raise BatchInputError([f"{len(numbered)} lines, over the limit of {max_lines}"])
    return parse_lines(numbered, settings, model=model)


def parse_lines(
    numbered: Iterable[tuple[int, str]], settings: Settings, *, model: str | None = None
) -> list[BatchLine]:
    lines: list[BatchLine] = []
    problems: list[str] = []
    seen: set[str] = set()
    for number, text in numbered:
        try:
            line = parse_line(text, settings, model=model)
            if line.custom_id in seen:
                raise InvalidRequest(f"custom_id {line.custom_id!r} is used twice")
            seen.add(line.custom_id)
            lines.append(line)
        except InvalidRequest as e:
            problems.append(f"line {number}: {e}")
    if problems:
        raise BatchInputError(problems)
    return lines


def parse_line(text: str, settings: Settings, *, model: str | None = None) -> BatchLine:
    # Imported here: bodies go through the gateway's models, and only a batch being
    # parsed should load the web stack (``tokenq`` commands stay light).
    from producer.batch.bodies import parse_body

    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"not JSON ({e})") from e
    if not isinstance(data, dict):
        raise InvalidRequest("a line must be a JSON object")
    custom_id = _custom_id(data.get("custom_id"))
    body = _body(data)
    return parse_body(custom_id, _kind(data, body), body, settings, model)


def _custom_id(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest("custom_id: give a non-empty string")
    if len(value) > MAX_CUSTOM_ID_CHARS:
        raise InvalidRequest(f"custom_id: longer than {MAX_CUSTOM_ID_CHARS} characters")
    return value


def _body(data: dict[str, Any]) -> dict[str, Any]:
    if "body" not in data:
        return {k: v for k, v in data.items() if k not in ("custom_id", "method", "url")}
    if not isinstance(data["body"], dict):
        raise InvalidRequest("body: must be a JSON object")
    return data["body"]


def _kind(data: dict[str, Any], body: dict[str, Any]) -> Kind:
    if data.get("method", "POST") != "POST":
        raise InvalidRequest(f"method: only POST is supported, not {data['method']!r}")
    url = data.get("url")
    if url is None:
        for field, kind in BODY_KINDS:
            if field in body:
                return kind
        raise InvalidRequest("body: give messages, prompt or input (or the line's url)")
    if url not in URL_KINDS:
        raise InvalidRequest(f"url: {url!r} is not supported; use one of {', '.join(URL_KINDS)}")
    return URL_KINDS[url]
