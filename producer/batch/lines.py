"""Batch input: JSONL lines in OpenAI's batch format (or plain bodies) to tokenq requests.

A line is ``{"custom_id", "method": "POST", "url": "/v1/chat/completions" |
"/v1/completions" | "/v1/embeddings", "body": {...}}``; ``url`` and ``method`` may be
left out (the body's ``messages``, ``prompt`` or ``input`` says which), and so may
``body`` (the rest of the line is the body). An embeddings line embeds one text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from producer.requests import validate_request
from shared.errors import InvalidRequest
from shared.models import MAX_METADATA_ITEMS, OPENAI_PASSTHROUGH_SAMPLING, GenerationRequest
from shared.settings import Settings

Kind = Literal["chat", "completion", "embedding"]
URL_KINDS: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
}
EMBEDDING_KNOWN = {"model", "input", "dimensions", "encoding_format", "user", "metadata"}
# OpenAI fields that are accepted only at the value that changes nothing.
NEUTRAL = {"n": 1, "stream": False, "logprobs": False}
IGNORED = ("user", "store", "service_tier")
KNOWN = {
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "metadata",
    "response_format",
    *OPENAI_PASSTHROUGH_SAMPLING,
    *NEUTRAL,
    *IGNORED,
}
MAX_CUSTOM_ID_CHARS = 200
# The driver adds batch_id and custom_id to each line's metadata.
MAX_LINE_METADATA = MAX_METADATA_ITEMS - 2
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
class BatchLine:
    custom_id: str
    kind: Kind
    request: GenerationRequest

    def to_json(self) -> bytes:
        request = self.request.model_dump(mode="json")
        return orjson.dumps({"custom_id": self.custom_id, "kind": self.kind, "request": request})

    @classmethod
    def from_json(cls, data: bytes | str) -> BatchLine:
        raw = orjson.loads(data)
        request = GenerationRequest.model_validate(raw["request"])
        return cls(raw["custom_id"], raw["kind"], request)


def parse_jsonl(
    text: str | bytes, settings: Settings, *, model: str | None = None, max_lines: int = 50_000
) -> list[BatchLine]:
    """Every non-blank line parsed and validated; raises BatchInputError naming the bad ones."""
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
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"not JSON ({e})") from e
    if not isinstance(data, dict):
        raise InvalidRequest("a line must be a JSON object")
    custom_id = _custom_id(data.get("custom_id"))
    body = _body(data)
    kind = _kind(data, body)
    return BatchLine(custom_id, kind, to_request(body, kind, settings, model=model))


def to_request(
    body: Mapping[str, Any], kind: Kind, settings: Settings, *, model: str | None = None
) -> GenerationRequest:
    if kind == "embedding":
        return _embed_request(body, settings, model)
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise InvalidRequest(f"body: unsupported field(s) {', '.join(unknown)}")
    for name, neutral in NEUTRAL.items():
        if name in body and body[name] != neutral:
            raise InvalidRequest(f"body.{name}: only {neutral!r} is supported")
    metadata = body.get("metadata") or {}
    if isinstance(metadata, dict) and len(metadata) > MAX_LINE_METADATA:
        raise InvalidRequest(f"body.metadata: at most {MAX_LINE_METADATA} items in a batch line")
    fields: dict[str, Any] = {
        "model": body.get("model") or model or settings.default_model,
        "sampling": _sampling(body),
        "metadata": metadata,
    }
    if kind == "chat":
        fields["messages"] = [_message(m) for m in _list(body.get("messages"), "messages")]
    else:
        fields["prompt"] = _prompt(body.get("prompt"))
    return validate_request(settings, fields)


def _embed_request(
    body: Mapping[str, Any], settings: Settings, model: str | None
) -> GenerationRequest:
    unknown = sorted(set(body) - EMBEDDING_KNOWN)
    if unknown:
        raise InvalidRequest(f"body: unsupported field(s) {', '.join(unknown)}")
    if body.get("encoding_format", "float") != "float":
        raise InvalidRequest("body.encoding_format: only 'float' is supported in a batch")
    text = body.get("input")
    if isinstance(text, list) and len(text) == 1:
        text = text[0]
    if not isinstance(text, str):
        raise InvalidRequest("body.input: give one text per batch line")
    fields = {
        "model": body.get("model") or model or settings.default_model,
        "task": "embed",
        "prompt": text,
        "dimensions": body.get("dimensions"),
        "metadata": body.get("metadata") or {},
    }
    return validate_request(settings, fields)


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
        return "chat" if "messages" in body else "embedding" if "input" in body else "completion"
    if url not in URL_KINDS:
        raise InvalidRequest(f"url: {url!r} is not supported; use one of {', '.join(URL_KINDS)}")
    return URL_KINDS[url]


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    values = {
        name: body[name] for name in OPENAI_PASSTHROUGH_SAMPLING if body.get(name) is not None
    }
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        values["max_tokens"] = max_tokens
    stop = body.get("stop")
    if stop is not None:
        values["stop"] = [stop] if isinstance(stop, str) else stop
    schema = _response_schema(body.get("response_format"))
    if schema is not None:
        if "guided_json" in values or "guided_regex" in values:
            raise InvalidRequest("body.response_format: give it or guided_json/guided_regex")
        values["guided_json"] = schema
    return values


def _response_schema(response_format: object) -> object:
    """The guided_json schema a response_format asks for (None for text)."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema" and isinstance(response_format, dict):
        schema = (response_format.get("json_schema") or {}).get("schema")
        if isinstance(schema, dict):
            return schema
    raise InvalidRequest(
        "body.response_format: give {'type': 'text' | 'json_object'} or "
        "{'type': 'json_schema', 'json_schema': {'schema': {...}}}"
    )


def _message(message: object) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise InvalidRequest("messages: each message must be an object")
    role = "system" if message.get("role") == "developer" else message.get("role")
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return {"role": role, "content": content}


def _prompt(prompt: object) -> object:
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise InvalidRequest("prompt: give one prompt per line, not a list")
        return prompt[0]
    return prompt


def _list(value: object, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidRequest(f"{name}: must be a list")
    return value
