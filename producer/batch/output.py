"""Output and error JSONL lines, in the shape of OpenAI's batch output files."""

from __future__ import annotations

from typing import Any

import orjson

from producer.batch.lines import Kind
from shared.models import FinishReason, Result

OK_REASONS = (FinishReason.STOP, FinishReason.LENGTH)


def result_line(custom_id: str, kind: Kind, result: Result) -> tuple[bool, bytes]:
    """(True, output line) for a request that finished, else (False, error line)."""
    if result.finish_reason not in OK_REASONS:
        message = result.error or f"request ended with finish_reason {result.finish_reason}"
        return False, error_line(custom_id, str(result.finish_reason), message, result.id)
    response = {"status_code": 200, "request_id": result.id, "body": _body(kind, result)}
    line = {
        "id": f"batch_req_{result.id}",
        "custom_id": custom_id,
        "response": response,
        "error": None,
    }
    return True, orjson.dumps(line)


def error_line(custom_id: str, code: str, message: str, request_id: str | None = None) -> bytes:
    line = {
        "id": f"batch_req_{request_id}" if request_id else None,
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
    return orjson.dumps(line)


def _body(kind: Kind, result: Result) -> dict[str, Any]:
    if kind == "embedding":
        return _embedding_body(result)
    usage = result.usage
    body: dict[str, Any] = {
        "id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{result.id}",
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "model": result.model,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        },
    }
    choice: dict[str, Any] = {"index": 0, "finish_reason": str(result.finish_reason)}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": result.text}
    else:
        choice["text"] = result.text
    body["choices"] = [choice]
    return body


def _embedding_body(result: Result) -> dict[str, Any]:
    data = {"object": "embedding", "index": 0, "embedding": list(result.embedding or ())}
    num_tokens = result.usage.prompt_tokens
    return {
        "object": "list",
        "data": [data],
        "model": result.model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }
