"""The Responses API's objects as plain dicts: output items, usage and the response
(the shapes of the ``openai`` package's ``openai.types.responses``)."""

from __future__ import annotations

from typing import Any

from producer.refusals import refusal_of
from producer.responses.record import StoredResponse
from shared.models import FinalEvent, FinishReason

Item = dict[str, Any]
# A final event's finish reason: the response's status, and why it is incomplete.
STATUSES: dict[FinishReason, str] = {
    FinishReason.STOP: "completed",
    FinishReason.LENGTH: "incomplete",
    FinishReason.TIMEOUT: "incomplete",
    FinishReason.CANCELLED: "cancelled",
    FinishReason.EXPIRED: "failed",
    FinishReason.ERROR: "failed",
}
INCOMPLETE_REASONS = {FinishReason.LENGTH: "max_output_tokens", FinishReason.TIMEOUT: "timeout"}
# The native fields a worker's refusal may name, as the Responses API calls them.
PARAM_NAMES = {
    "prompt": "input",
    "messages": "input",
    "prompt_token_ids": "input",
    "max_tokens": "max_output_tokens",
    "guided_json": "text.format",
    "guided_regex": "text.format",
    "guided_structural_tag": "text.format",
    "lora": "model",
}
TERMINAL_EVENTS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "cancelled": "response.cancelled",
}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> Item:
    content = [] if text is None else [output_text(text)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": content}  # fmt: skip


def reasoning_text(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(item_id: str, text: str | None, status: str) -> Item:
    content = [] if text is None else [reasoning_text(text)]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content,
            "status": status}  # fmt: skip


def call_item(item_id: str, call: dict[str, Any], arguments: str, status: str) -> Item:
    """A ``function_call`` item from an OpenAI ``tool_calls`` entry (``reply.Delta``)."""
    name = call["function"]["name"]
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": name,
            "arguments": arguments, "status": status}  # fmt: skip


def usage(final: FinalEvent, reasoning_tokens: int | None) -> dict[str, Any]:
    prompt, completion = final.usage.prompt_tokens, final.usage.completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens or 0},
        "total_tokens": prompt + completion,
    }


def error_of(final: FinalEvent) -> dict[str, str] | None:
    """A failed response's error (what it ended with), as OpenAI's ``ResponseError``:
    ``invalid_prompt`` for what the worker refused (the client's mistake)."""
    refusal = refusal_of(final)
    if refusal is not None:
        param = refusal.param_in(PARAM_NAMES)
        named = refusal.message if param is None else f"{param}: {refusal.message}"
        return {"code": "invalid_prompt", "message": named}
    if final.finish_reason is FinishReason.EXPIRED:
        why = f"the deadline passed before the request ran ({final.error})"
        return {"code": "deadline_expired", "message": why}
    if final.finish_reason is FinishReason.ERROR:
        return {"code": "server_error", "message": f"generation failed: {final.error}"}
    return None


def response_object(
    record: StoredResponse,
    status: str,
    output: list[Item],
    final: FinalEvent | None = None,
    reasoning_tokens: int | None = None,
) -> dict[str, Any]:
    """The response as ``GET /v1/responses/{id}`` answers it; ``final`` once it ended."""
    ended = final is not None
    total_s = final.timings.total_s if final is not None else None
    reason = INCOMPLETE_REASONS.get(final.finish_reason) if final is not None else None
    return {
        "id": record.id,
        "object": "response",
        "created_at": record.created_at,
        "status": status,
        "background": record.background,
        "error": error_of(final) if final is not None else None,
        "incomplete_details": None if reason is None else {"reason": reason},
        "instructions": record.instructions,
        "max_output_tokens": record.max_output_tokens,
        "max_tool_calls": None,
        "metadata": record.metadata,
        "model": record.model,
        "output": output,
        "parallel_tool_calls": record.parallel_tool_calls,
        "previous_response_id": record.previous_response_id,
        "reasoning": record.reasoning or {"effort": None, "summary": None},
        "service_tier": "default",
        "store": record.store,
        "temperature": 1.0 if record.temperature is None else record.temperature,
        "text": record.text,
        "tool_choice": record.tool_choice,
        "tools": record.tools,
        "top_p": 1.0 if record.top_p is None else record.top_p,
        "truncation": "disabled",
        "usage": usage(final, reasoning_tokens) if final is not None else None,
        "user": record.user,
        "completed_at": record.created_at + total_s if ended and total_s is not None else None,
    }
