"""A Responses body as tokenq runs it: read into a chat request and planned by the chat
route's own translation (``producer.openai.requests.chat_request``), so tools and
``tool_choice``, strict schemas, the model's native tool format and reasoning go exactly
as they do on ``/v1/chat/completions``. Errors name the Responses fields."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from producer.openai.errors import ApiError, from_validation_errors, invalid
from producer.openai.requests import Origin, chat_request
from producer.openai.schemas import ChatCompletionRequest
from producer.responses.inputs import Item, chat_messages, input_items
from producer.responses.record import StoredResponse
from producer.responses.schemas import FunctionTool, ResponsesBody, TextFormat
from shared.chat import ChatFeatures
from shared.models import GenerationRequest

# tokenq's sampling fields a body may carry, passed on under the same names.
SAMPLING_EXTRAS = (
    "seed",
    "top_k",
    "min_p",
    "min_tokens",
    "repetition_penalty",
    "ignore_eos",
    "stop",
)
# Chat names in the translation's errors, and the Responses names they stand for.
_RENAMES = (
    (re.compile(r"\bresponse_format\.json_schema\.schema\b"), "text.format.schema"),
    (re.compile(r"\bresponse_format\b"), "text.format"),
    (re.compile(r"\b(max_completion_tokens|max_tokens)\b"), "max_output_tokens"),
    (re.compile(r"\btools\.(\d+)\.function\."), r"tools.\1."),
    (re.compile(r"\bmessages(\.\d+)?"), "input"),
)


@dataclass(frozen=True)
class ResponsePlan:
    """The record to store (ids come with the request's) and the request to queue."""

    record: StoredResponse
    request: GenerationRequest


def response_plan(
    body: ResponsesBody,
    origin: Origin,
    features: ChatFeatures | None = None,
    context: list[Item] | None = None,
) -> ResponsePlan:
    """The request for ``body``, continuing the conversation ``context`` (the items of
    ``previous_response_id``); ApiError (400) naming what cannot be served."""
    refuse_unsupported(body)
    items = input_items(body.input)
    context = context or []
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat = _chat_body(body, [*system, *chat_messages([*context, *items])])
    try:
        plan = chat_request(chat, origin, features)
    except ApiError as e:
        raise renamed(e) from e
    record = StoredResponse(
        model=body.model,
        instructions=body.instructions,
        input=items,
        context=context,
        tools=[
            t.model_dump(exclude_none=True) | {"strict": _strict(t.strict)}
            for t in body.tools or ()
        ],
        tool_choice=_echo_choice(body),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        text=_echo_text(body),
        temperature=body.temperature,
        top_p=body.top_p,
        max_output_tokens=body.max_output_tokens,
        metadata=body.metadata or {},
        previous_response_id=body.previous_response_id,
        store=body.store,
        background=body.background,
        reasoning=None if body.reasoning is None else body.reasoning.model_dump(exclude_none=True),
        user=body.user,
        tool_plan=plan.tools.to_dict(),
        reasoning_plan=None if plan.reasoning is None else plan.reasoning.to_dict(),
    )
    return ResponsePlan(record, plan.requests[0])


def refuse_unsupported(body: ResponsesBody) -> None:
    """Fields tokenq cannot honour, refused by name (saying what to send instead)."""
    refusals = (
        ("truncation", body.truncation == "auto", "tokenq does not truncate a conversation; "
         "leave truncation out or 'disabled'"),
        ("top_logprobs", bool(body.top_logprobs), "logprobs are served on "
         "/v1/chat/completions; leave top_logprobs out here"),
        ("max_tool_calls", body.max_tool_calls is not None, "not supported; leave it out"),
        ("conversation", body.conversation is not None, "conversations are not supported; "
         "continue one with previous_response_id"),
        ("prompt", body.prompt is not None, "prompt templates are not supported; send "
         "instructions and input"),
        ("background", body.background and not body.store, "a background response is read "
         "by id later, so it needs store: true"),
    )  # fmt: skip
    for name, refused, why in refusals:
        if refused:
            raise invalid(f"{name}: {why}", name, "unsupported")


def _chat_body(body: ResponsesBody, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning is not None and body.reasoning.effort is not None:
        kwargs.setdefault("reasoning_effort", body.reasoning.effort)
    fields = {
        "model": body.model,
        "messages": messages,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "metadata": body.metadata,
        "response_format": _response_format(body.text.format if body.text else None),
        "tools": [_chat_tool(t.model_dump()) for t in body.tools] if body.tools else None,
        "tool_choice": _chat_choice(body),
        "parallel_tool_calls": body.parallel_tool_calls,
        "chat_template_kwargs": kwargs or None,
        "priority": body.priority,
        "deadline": body.deadline,
        "idempotency_key": body.idempotency_key,
        "user": body.user,
        **{name: getattr(body, name) for name in SAMPLING_EXTRAS},
    }
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in fields.items() if v is not None}
        )
    except ValidationError as e:
        raise renamed(from_validation_errors(e.errors())) from e


def _response_format(fmt: TextFormat | None) -> dict[str, Any] | None:
    if fmt is None or fmt.type != "json_schema":
        return None if fmt is None else {"type": fmt.type}
    if fmt.schema_ is None:
        raise invalid(
            "text.format.schema: a json_schema format needs its schema", "text.format.schema"
        )
    schema = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}
    if fmt.description:
        schema["description"] = fmt.description
    return {"type": "json_schema", "json_schema": schema}


def _strict(strict: bool | None) -> bool:
    """A Responses function tool is strict unless it says otherwise (OpenAI's default)."""
    return strict is not False


def _echo_tool(tool: FunctionTool) -> dict[str, Any]:
    return {**tool.model_dump(exclude_none=True), "strict": _strict(tool.strict)}


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {k: tool[k] for k in ("name", "description", "parameters") if tool[k] is not None}
    return {"type": "function", "function": {**function, "strict": _strict(tool["strict"])}}


def _chat_choice(body: ResponsesBody) -> str | dict[str, Any] | None:
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice.name}}


def _echo_choice(body: ResponsesBody) -> str | dict[str, Any]:
    choice = body.tool_choice
    return choice if isinstance(choice, str) else "auto" if choice is None else choice.model_dump()


def _echo_text(body: ResponsesBody) -> dict[str, Any]:
    if body.text is None or body.text.format is None:
        return {"format": {"type": "text"}}
    return body.text.model_dump(by_alias=True, exclude_none=True)


def renamed(error: ApiError) -> ApiError:
    """``error`` with the chat route's field names as the Responses body's."""
    detail = error.detail
    message, param = detail.message, detail.param
    for pattern, name in _RENAMES:
        message = pattern.sub(name, message)
        param = None if param is None else pattern.sub(name, param)
    return ApiError(
        error.status,
        message,
        type=detail.type,
        param=param,
        code=detail.code,
        headers=error.headers,
    )
