"""An upload with ``purpose=batch`` is checked as OpenAI checks one: UTF-8 JSONL, each
line an object with a unique ``custom_id``, ``method`` POST, a supported ``url`` and a
``body`` object. Bodies themselves are read when a batch is made from the file (with
the live routes' parsers), so the file is refused here only for what no batch could
run."""

from __future__ import annotations

from typing import Any

import orjson

from producer.batch.bodies import MAX_CUSTOM_ID_CHARS, URL_KINDS
from producer.batch.lines import BatchInputError


class InvalidBatchFile(BatchInputError):
    """The uploaded batch file has bad lines (the message lists them by number)."""

    param = "file"


def check_batch_jsonl(data: bytes, max_lines: int) -> int:
    """The number of request lines; InvalidBatchFile naming every bad line."""
    try:
        raw = data.decode()
    except UnicodeDecodeError as e:
        raise InvalidBatchFile([f"the file is not UTF-8 text (byte {e.start})"]) from e
    numbered = [(n, s) for n, s in enumerate(raw.splitlines(), 1) if s.strip()]
    if not numbered:
        raise InvalidBatchFile(["the file has no lines"])
    if len(numbered) > max_lines:
        raise InvalidBatchFile([f"{len(numbered)} lines, over the limit of {max_lines}"])
    problems: list[str] = []
    seen: set[str] = set()
    for number, line in numbered:
        problem = _line_problem(line, seen)
        if problem is not None:
            problems.append(f"line {number}: {problem}")
    if problems:
        raise InvalidBatchFile(problems)
    return len(numbered)


def _line_problem(line: str, seen: set[str]) -> str | None:
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        return f"not JSON ({e})"
    if not isinstance(data, dict):
        return "a line must be a JSON object"
    problem = _field_problem(data)
    if problem is None and data["custom_id"] in seen:
        problem = f"custom_id {data['custom_id']!r} is used twice"
    if problem is None:
        seen.add(data["custom_id"])
    return problem


def _field_problem(data: dict[str, Any]) -> str | None:
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "custom_id: give a non-empty string"
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        return f"custom_id: longer than {MAX_CUSTOM_ID_CHARS} characters"
    if data.get("method") != "POST":
        return f"method: must be 'POST' (got {data.get('method')!r})"
    if data.get("url") not in URL_KINDS:
        return f"url: {data.get('url')!r} is not supported; use one of {', '.join(URL_KINDS)}"
    if not isinstance(data.get("body"), dict):
        return "body: give the request's body as a JSON object"
    return None
