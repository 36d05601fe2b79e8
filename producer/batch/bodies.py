"""A batch line's body parsed as the live route parses it, by the gateway's own models.

Chat and completion bodies go through ``ChatCompletionRequest`` / ``CompletionRequest``
and ``chat_request`` / ``completion_request``, so a line accepts every field the live
route accepts (tools, n, response_format, logprobs, ...) and a bad one gets the same 400
message. Three fields only mean something on a live call and are refused by name: the
batch sets each line's priority and idempotency key (``<batch id>:<custom_id>``), and
its answers go to files, not streams. A line's ``deadline`` counts from the submit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from producer.batch.lines import BatchLine, Kind, LineError
from producer.gateway.auth import OPEN_TENANT, Principal
from producer.gateway.errors import ApiError, from_validation_errors, invalid
from producer.gateway.openai_requests import chat_request, completion_request
from producer.gateway.openai_schemas import ChatCompletionRequest, CompletionRequest
from producer.requests import validate_request
from shared.errors import InvalidRequest
from shared.models import MAX_METADATA_ITEMS, TENANT, GenerationRequest
from shared.priority import MAX_PRIORITY
from shared.settings import Settings

Body = Mapping[str, Any]
M = TypeVar("M", bound=BaseModel)
# The driver sets each line's priority and tenant; the caller here only parses.
BATCH_CALLER = Principal(OPEN_TENANT, MAX_PRIORITY, sees_all=True)
LIVE_ONLY = {
    "priority": "a batch line runs at the batch's priority; set priority on the batch",
    "idempotency_key": "a batch line's requests are keyed by the batch id and custom_id",
    "stream": "a batch line's answer goes to the output file; leave stream out or false",
}
# The driver adds batch_id, custom_id and tenant to each line's metadata.
MAX_LINE_METADATA = MAX_METADATA_ITEMS - 3
EMBEDDING_KNOWN = {"model", "input", "dimensions", "encoding_format", "user", "metadata"}


def parse_body(
    custom_id: str, kind: Kind, body: Body, settings: Settings, model: str | None
) -> BatchLine:
    """The line, or (for a body the live route would refuse) the line with its error."""
    fields = {**body, "model": body.get("model") or model or settings.default_model}
    try:
        return PARSERS[kind](custom_id, fields, settings)
    except ApiError as e:
        detail = e.detail
        error = LineError(detail.message, detail.param, detail.code, detail.type, e.status)
    except InvalidRequest as e:
        error = LineError(str(e), code="invalid_value")
    return BatchLine(custom_id, kind, None, error=error)


def _chat(custom_id: str, body: Body, settings: Settings) -> BatchLine:
    parsed = _validated(ChatCompletionRequest, body)
    plan = chat_request(parsed, BATCH_CALLER)
    request = _settled(plan.requests[0], settings)
    tools = plan.tools if plan.tools.active else None
    return BatchLine(custom_id, "chat", request, parsed.n, tools, parsed.logprobs)


def _completion(custom_id: str, body: Body, settings: Settings) -> BatchLine:
    parsed = _validated(CompletionRequest, body)
    request = _settled(completion_request(parsed, BATCH_CALLER), settings)
    logprobs = parsed.logprobs is not None
    return BatchLine(custom_id, "completion", request, parsed.n, logprobs=logprobs)


def _embedding(custom_id: str, body: Body, settings: Settings) -> BatchLine:
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
    return BatchLine(custom_id, "embedding", validate_request(settings, fields))


PARSERS: dict[Kind, Callable[[str, Body, Settings], BatchLine]] = {
    "chat": _chat,
    "completion": _completion,
    "embedding": _embedding,
}


def _validated(model: type[M], body: Body) -> M:
    for name, why in LIVE_ONLY.items():
        value = body.get(name)
        if value is not None and not (name == "stream" and value is False):
            raise invalid(f"{name}: {why}", name, "unsupported")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from e


def _settled(request: GenerationRequest, settings: Settings) -> GenerationRequest:
    """The request without the parsing caller's tenant, checked as a submit checks it."""
    metadata = {k: v for k, v in request.metadata.items() if k != TENANT}
    if len(metadata) > MAX_LINE_METADATA:
        message = f"metadata: at most {MAX_LINE_METADATA} items in a batch line"
        raise invalid(message, "metadata")
    return validate_request(settings, request.model_copy(update={"metadata": metadata}))
