"""Output and error JSONL lines, in the shape of OpenAI's batch output files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from producer.batch.lines import BatchLine
from shared.models import FinishReason, Result

if TYPE_CHECKING:
    from producer.streams.entries import Entry

OK_REASONS = (FinishReason.STOP, FinishReason.LENGTH)


def result_line(
    line: BatchLine,
    results: Sequence[Result],
    streams: Sequence[Sequence[Entry]] | None = None,
) -> tuple[bool, bytes]:
    """(True, output line) when every choice finished, else (False, error line)."""
    for result in results:
        if result.finish_reason not in OK_REASONS:
            message = result.error or f"request ended with finish_reason {result.finish_reason}"
            code = str(result.finish_reason)
            return False, error_line(line.custom_id, code, message, result.id)
    response = {
        "status_code": 200,
        "request_id": ",".join(r.id for r in results),  # as the live route's header
        "body": _body(line, results, streams),
    }
    output = {
        "id": f"batch_req_{results[0].id}",
        "custom_id": line.custom_id,
        "response": response,
        "error": None,
    }
    return True, orjson.dumps(output)


def refused_line(line: BatchLine) -> bytes:
    """The error line of a line whose body was refused: the live route's answer, as the
    response, and its message as the error."""
    error = line.error
    if error is None:
        raise ValueError(f"line {line.custom_id!r} was not refused")
    detail = {"message": error.message, "type": error.type, "param": error.param}
    body = {"error": {**detail, "code": error.code}}
    output = {
        "id": None,
        "custom_id": line.custom_id,
        "response": {"status_code": error.status, "request_id": None, "body": body},
        "error": {"code": error.code or error.type, "message": error.message},
    }
    return orjson.dumps(output)


def error_line(custom_id: str, code: str, message: str, request_id: str | None = None) -> bytes:
    line = {
        "id": f"batch_req_{request_id}" if request_id else None,
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
    return orjson.dumps(line)


def _body(
    line: BatchLine, results: Sequence[Result], streams: Sequence[Sequence[Entry]] | None
) -> dict[str, Any]:
    if line.kind == "embedding":
        return _embedding_body(results[0])
    # Imported here: only a worker that collects results needs the OpenAI renderer.
    from producer.batch.render import completion_body, response_body

    if line.kind == "response":
        return response_body(line, results[0], None if streams is None else streams[0])
    return completion_body(line, results, streams)


def _embedding_body(result: Result) -> dict[str, Any]:
    data = {"object": "embedding", "index": 0, "embedding": list(result.embedding or ())}
    num_tokens = result.usage.prompt_tokens
    return {
        "object": "list",
        "data": [data],
        "model": result.model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }
