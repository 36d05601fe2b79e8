"""Anthropic Messages bodies to tokenq requests, through the chat route's own mapping
(``producer.openai.requests.chat_request``): a messages body becomes the OpenAI chat
body it means, so tools, tool choice, reasoning and the chat template run exactly as
on ``/v1/chat/completions`` (and a count of its prompt equals that route's)."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from producer.anthropic.schemas import (
    CountTokensRequest,
    MessageParam,
    MessagesRequest,
    TextBlock,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
    UnsupportedBlock,
)
from producer.openai.errors import ApiError, from_validation_errors, invalid
from producer.openai.requests import ChatPlan, Origin, chat_request
from producer.openai.schemas import ChatCompletionRequest
from shared.chat import ChatFeatures


def messages_plan(
    body: CountTokensRequest, origin: Origin, features: ChatFeatures | None = None
) -> ChatPlan:
    """The request for ``body`` (a messages body, or a count_tokens body: its prompt)."""
    chat = chat_body(body)
    return chat_request(chat, origin, features)


def chat_body(body: CountTokensRequest) -> ChatCompletionRequest:
    """The OpenAI chat body ``body`` means; a 400 naming the Anthropic field when
    there is none."""
    data: dict[str, Any] = {
        "model": body.model,
        "messages": _system(body.system) + _messages(body.messages),
        "priority": body.priority,
        "deadline": body.deadline,
        "idempotency_key": body.idempotency_key,
    }
    if body.tools:
        data["tools"] = [_tool(t.name, t.description, t.input_schema) for t in body.tools]
        data.update(_tool_choice(body.tool_choice))
    elif body.tool_choice is not None and body.tool_choice.type != "none":
        raise invalid("tool_choice: give tools to choose from", "tool_choice")
    if body.thinking is not None and body.thinking.type == "disabled":
        data["chat_template_kwargs"] = {"enable_thinking": False}
    if isinstance(body, MessagesRequest):
        data.update(_sampling(body))
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from e


def _sampling(body: MessagesRequest) -> dict[str, Any]:
    if body.max_tokens < 1:
        raise invalid(f"max_tokens: must be at least 1 (got {body.max_tokens})", "max_tokens")
    values = {
        "max_tokens": body.max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "stop": body.stop_sequences or None,
        "user": body.metadata.user_id if body.metadata else None,
    }
    return {k: v for k, v in values.items() if v is not None}


def _system(system: str | list[TextBlock] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = system if isinstance(system, str) else "".join(b.text for b in system)
    return [{"role": "system", "content": text}]


def _messages(messages: list[MessageParam]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for at, message in enumerate(messages):
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
        elif message.role == "user":
            out.extend(_user_turn(message, f"messages.{at}.content"))
        else:
            out.append(_assistant_turn(message, f"messages.{at}.content"))
    return out


def _user_turn(message: MessageParam, where: str) -> list[dict[str, Any]]:
    """Tool results first (they answer the turn before), then the user's text."""
    results, texts = [], []
    for n, block in enumerate(message.content):
        if isinstance(block, ToolResultBlock):
            results.append(_tool_result(block))
        elif isinstance(block, TextBlock):
            texts.append(block.text)
        else:
            _refuse(block, f"{where}.{n}", "user")
    turn = [{"role": "user", "content": "".join(texts)}] if texts else []
    return results + turn


def _assistant_turn(message: MessageParam, where: str) -> dict[str, Any]:
    texts, calls = [], []
    for n, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            arguments = orjson.dumps(block.input).decode()
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": arguments}})  # fmt: skip
        elif isinstance(block, UnsupportedBlock | ToolResultBlock):
            _refuse(block, f"{where}.{n}", "assistant")
        # thinking blocks: an earlier answer's reasoning, which templates leave out
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        turn["tool_calls"] = calls
    return turn


def _tool_result(block: ToolResultBlock) -> dict[str, Any]:
    content = block.content
    text = content if isinstance(content, str) else "".join(b.text for b in content)
    if block.is_error:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}


def _refuse(block: object, where: str, role: str) -> None:
    kind = getattr(block, "type", "?")
    raise invalid(
        f"{where}: a {kind} block is not supported in a {role} message (tokenq serves text "
        "models: text, tool_use and tool_result blocks)",
        where,
        "unsupported",
    )


def _tool(name: str, description: str | None, schema: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "parameters": schema}
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


def _tool_choice(choice: ToolChoice | None) -> dict[str, Any]:
    """Anthropic's tool_choice as OpenAI's: auto, any (required), tool (named), none."""
    if choice is None:
        return {}
    parallel = {} if choice.disable_parallel_tool_use is None else {
        "parallel_tool_calls": not choice.disable_parallel_tool_use
    }  # fmt: skip
    if choice.type == "tool":
        if not choice.name:
            raise ApiError(400, "tool_choice.name: name the tool to use", param="tool_choice.name")
        named = {"type": "function", "function": {"name": choice.name}}
        return {"tool_choice": named, **parallel}
    mode = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    return {"tool_choice": mode, **parallel}
