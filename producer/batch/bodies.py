"""Batch input: JSONL lines in OpenAI's batch format (or plain bodies) to tokenq requests.

A line is ``{"custom_id", "method": "POST", "url": "/v1/chat/completions" |
"/v1/completions" | "/v1/embeddings" | "/v1/responses", "body": {...}}``; ``url`` and
``method`` may be left out (the body's ``messages``, ``prompt`` or ``input`` says which:
``input`` alone is an embeddings line), and so may ``body`` (the rest of the line is the
body). An embeddings line embeds one text. A responses line is read by the live route's
translation (``producer.responses.plan``); it is not stored, and it cannot continue a
stored response or run in the background, since it is already a batch's.

A line that cannot be told apart from the others (not JSON, no custom_id or one used
twice, an unknown url) refuses the whole file with BatchInputError, and nothing is
queued. A line whose body the live route would refuse is kept with that refusal: the
batch runs its other lines and writes the refusal to its error file.

A line's body is parsed as the live route parses it, by the OpenAI translation's models.

Chat and completion bodies go through ``ChatCompletionRequest`` / ``CompletionRequest``
and ``chat_request`` / ``completion_request``, so a line accepts every field the live
route accepts (tools, n, response_format, logprobs, ...) and a bad one gets the same 400
message. Three fields only mean something on a live call and are refused by name: the
batch sets each line's priority and idempotency key (``<batch id>:<custom_id>``), and
its answers go to files, not streams. A line's ``deadline`` counts from the submit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from producer.batch.lines import BatchInputError, BatchLine, Kind, LineError
from producer.openai.errors import ApiError, from_validation_errors, invalid
from producer.openai.requests import Origin, chat_request, completion_request
from producer.openai.schemas import ChatCompletionRequest, CompletionRequest
from producer.requests import validate_request
from producer.responses.plan import response_plan
from producer.responses.schemas import ResponsesBody
from shared.chat import ChatFeatures
from shared.errors import InvalidRequest
from shared.models import MAX_METADATA_ITEMS, GenerationRequest
from shared.priority import Priority
from shared.settings import Settings

Body = Mapping[str, Any]
FeaturesOf = Callable[[str], ChatFeatures | None]
M = TypeVar("M", bound=BaseModel)
# The driver sets each line's priority and tenant; parsing only checks the body.
BATCH_ORIGIN = Origin(int(Priority.NORMAL))
URL_KINDS: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
    "/v1/responses": "response",
}
BODY_KINDS: tuple[tuple[str, Kind], ...] = (
    ("messages", "chat"),
    ("prompt", "completion"),
    ("input", "embedding"),
)
MAX_CUSTOM_ID_CHARS = 200
LIVE_ONLY = {
    "priority": "a batch line runs at the batch's priority; set priority on the batch",
    "idempotency_key": "a batch line's requests are keyed by the batch id and custom_id",
    "stream": "a batch line's answer goes to the output file; leave stream out or false",
    "echo": "a batch line's answer is not rendered with its prompt; leave echo out or false",
    "prompt_logprobs": "a batch line's answer does not carry prompt logprobs; leave it out",
}
# The driver adds batch_id and custom_id to each line's metadata (and kept a third item
# for the tenant before the tenant was a field of the request: the bound is unchanged).
MAX_LINE_METADATA = MAX_METADATA_ITEMS - 3
# What a responses line may not say, and why (absent or false is fine).
RESPONSE_LIVE_ONLY = {
    "previous_response_id": "a batch line cannot continue a stored response; send the "
    "whole conversation as input",
    "background": "a batch runs in the background already; leave background out",
    "store": "a batch line's response goes to the output file, not the store; leave store out",
}
EMBEDDING_KNOWN = {"model", "input", "dimensions", "encoding_format", "user", "metadata"}


@dataclass(frozen=True)
class Reading:
    """What reading a file's lines takes beside them: the settings, the model of lines
    that name none, and what each model's chat template does (its live workers say)."""

    settings: Settings
    model: str | None = None
    features: FeaturesOf = field(default=lambda _: None)


def parse_jsonl(
    text: str | bytes,
    settings: Settings,
    *,
    model: str | None = None,
    max_lines: int = 50_000,
    features: FeaturesOf | None = None,
) -> list[BatchLine]:
    """Every non-blank line parsed; raises BatchInputError naming the lines it cannot
    tell apart. Lines with bad bodies come back with their ``error``. ``features``
    gives a model's chat features (tools through its template, reasoning); without it
    every model takes tools through the fallback prompt."""
    raw = text.decode() if isinstance(text, bytes) else text
    numbered = [(n, s) for n, s in enumerate(raw.splitlines(), 1) if s.strip()]
    if not numbered:
        raise BatchInputError(["the file has no lines"])
    if len(numbered) > max_lines:
        raise BatchInputError([f"{len(numbered)} lines, over the limit of {max_lines}"])
    lookup = functools.cache(features) if features is not None else (lambda _: None)
    return parse_lines(numbered, Reading(settings, model, lookup))


def parse_lines(numbered: Iterable[tuple[int, str]], reading: Reading) -> list[BatchLine]:
    lines: list[BatchLine] = []
    problems: list[str] = []
    seen: set[str] = set()
    for number, text in numbered:
        try:
            line = parse_line(text, reading)
            if line.custom_id in seen:
                raise InvalidRequest(f"custom_id {line.custom_id!r} is used twice")
            seen.add(line.custom_id)
            lines.append(line)
        except InvalidRequest as e:
            problems.append(f"line {number}: {e}")
    if problems:
        raise BatchInputError(problems)
    return lines


def parse_line(text: str, reading: Reading) -> BatchLine:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"not JSON ({e})") from e
    if not isinstance(data, dict):
        raise InvalidRequest("a line must be a JSON object")
    custom_id = _custom_id(data.get("custom_id"))
    body = _body(data)
    return parse_body(custom_id, _kind(data, body), body, reading)


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


def parse_body(custom_id: str, kind: Kind, body: Body, reading: Reading) -> BatchLine:
    """The line, or (for a body the live route would refuse) the line with its error."""
    model = body.get("model") or reading.model or reading.settings.default_model
    try:
        return PARSERS[kind](custom_id, {**body, "model": model}, reading)
    except ApiError as e:
        detail = e.detail
        error = LineError(detail.message, detail.param, detail.code, detail.type, e.status)
    except InvalidRequest as e:
        error = LineError(str(e), code="invalid_value")
    return BatchLine(custom_id, kind, None, error=error)


def _chat(custom_id: str, body: Body, reading: Reading) -> BatchLine:
    parsed = _validated(ChatCompletionRequest, body)
    plan = chat_request(parsed, BATCH_ORIGIN, reading.features(parsed.model))
    request = _settled(plan.requests[0], reading.settings)
    tools = plan.tools if plan.tools.active else None
    return BatchLine(
        custom_id, "chat", request, parsed.n, tools, parsed.logprobs, reasoning=plan.reasoning
    )


def _completion(custom_id: str, body: Body, reading: Reading) -> BatchLine:
    parsed = _validated(CompletionRequest, body)
    prompts = completion_request(parsed, BATCH_ORIGIN)
    if len(prompts) > 1:
        message = f"prompt: a batch line takes one prompt (got {len(prompts)}); give each a line"
        raise invalid(message, "prompt", "unsupported")
    request = _settled(prompts[0], reading.settings)
    logprobs = parsed.logprobs is not None
    return BatchLine(custom_id, "completion", request, parsed.n, logprobs=logprobs)


def _response(custom_id: str, body: Body, reading: Reading) -> BatchLine:
    for name, why in RESPONSE_LIVE_ONLY.items():
        if body.get(name):
            raise invalid(f"{name}: {why}", name, "unsupported")
    parsed = _validated(ResponsesBody, body)
    made = response_plan(parsed, BATCH_ORIGIN, reading.features(parsed.model))
    request = _settled(made.request, reading.settings)
    record = made.record.model_copy(update={"store": False}).model_dump(mode="json")
    tools = made.record.tools_plan()
    return BatchLine(
        custom_id,
        "response",
        request,
        tools=tools if tools.active else None,
        reasoning=made.record.think_plan(),
        response=record,
    )


def _embedding(custom_id: str, body: Body, reading: Reading) -> BatchLine:
    unknown = sorted(set(body) - EMBEDDING_KNOWN)
    if unknown:
        raise invalid(f"unsupported field(s) {', '.join(unknown)}", unknown[0], "unsupported")
    if body.get("encoding_format", "float") != "float":
        message = "encoding_format: only 'float' is supported in a batch"
        raise invalid(message, "encoding_format", "unsupported")
    text = body.get("input")
    if isinstance(text, list) and len(text) == 1:
        text = text[0]
    if not isinstance(text, str):
        raise invalid("input: give one text per batch line", "input")
    fields = {
        "model": body["model"],
        "task": "embed",
        "prompt": text,
        "dimensions": body.get("dimensions"),
        "metadata": body.get("metadata") or {},
    }
    return BatchLine(custom_id, "embedding", validate_request(reading.settings, fields))


PARSERS: dict[Kind, Callable[[str, Body, Reading], BatchLine]] = {
    "chat": _chat,
    "completion": _completion,
    "embedding": _embedding,
    "response": _response,
}


def _validated(model: type[M], body: Body) -> M:
    for name, why in LIVE_ONLY.items():
        value = body.get(name)
        if value is not None and not (name in ("stream", "echo") and value is False):
            raise invalid(f"{name}: {why}", name, "unsupported")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from e


def _settled(request: GenerationRequest, settings: Settings) -> GenerationRequest:
    """The request checked as a submit checks it."""
    if len(request.metadata) > MAX_LINE_METADATA:
        message = f"metadata: at most {MAX_LINE_METADATA} items in a batch line"
        raise invalid(message, "metadata")
    return validate_request(settings, request)
