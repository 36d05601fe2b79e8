"""tokenq stream events to OpenAI responses: streamed chunks and whole completions.

Chunks are built as plain dicts on the hot path (one per token per stream); the
pydantic models in ``schemas`` document them and the tests check they agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from producer.gateway.entries import Entry
from producer.openai.errors import ApiError, ErrorDetail, ErrorResponse
from producer.openai.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionUsage,
    TokenLogprob,
    ToolCall,
    TopLogprob,
)
from producer.openai.tools import ToolPlan, parse_tool_calls
from shared.models import FinalEvent, FinishReason, TokenEvent

DONE = b"data: [DONE]\n\n"
Kind = Literal["chat", "text"]


def _data(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def token_logprobs(event: TokenEvent) -> list[TokenLogprob]:
    """The event's per-token logprobs, step by step when it is a coalesced one."""
    return [logprob for step in event.split() for logprob in _step_logprobs(step)]


def _step_logprobs(event: TokenEvent) -> list[TokenLogprob]:
    """A step's per-token logprobs; a token's text is known alone only when the step
    produced one token, else it reads ``token_id:<id>`` (as vLLM's option does)."""
    single = len(event.token_ids) == 1

    def name(token_id: int) -> str:
        return event.text if single and token_id == event.token_ids[0] else f"token_id:{token_id}"

    return [
        TokenLogprob(
            token=name(int(e["token_id"])),
            logprob=float(e["logprob"]),
            top_logprobs=[
                TopLogprob(token=name(int(t["token_id"])), logprob=t["logprob"])
                for t in e.get("top", ())
            ],
        )
        for e in event.logprobs or ()
    ]


def failure(final: FinalEvent) -> ApiError | None:
    """The error a request that produced no answer gets (expired, failed)."""
    if final.finish_reason is FinishReason.EXPIRED:
        return ApiError(
            504,
            f"the deadline passed before the request ran ({final.error})",
            type="timeout",
            code="deadline_expired",
        )
    if final.finish_reason is FinishReason.ERROR:
        return ApiError(
            500, f"generation failed: {final.error}", type="server_error", code="generation_failed"
        )
    return None


@dataclass
class Renderer:
    """Accumulates one choice's events and renders them the OpenAI way; ``index`` is the
    choice's, ``tools`` says whether a chat reply may be tool calls."""

    kind: Kind
    request_id: str
    model: str
    include_usage: bool = False
    index: int = 0
    tools: ToolPlan | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    text_parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    offset: int = 0
    held: list[bytes] = field(default_factory=list)  # chunks held back while tools may come

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.request_id

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def add(self, entry: Entry) -> list[TokenLogprob]:
        self.text_parts.append(entry.text)
        entries = token_logprobs(entry.token()) if entry.fields.get("logprobs") else []
        self.logprobs.extend(entries)
        return entries

    def render(self, batch: list[Entry]) -> tuple[bytes, FinalEvent | None]:
        """The SSE bytes for a batch of entries, and its final event if it has one."""
        out, final = [], None
        for entry in batch:
            if entry.is_final:
                final = entry.final()
                out.append(self.final_chunks(final))
            else:
                out.append(self.token_chunk(entry))
        return b"".join(out), final

    # Streaming.
    def first_chunk(self) -> bytes:
        if self.kind == "chat":
            return self._chunk({"role": "assistant", "content": ""}, None, None)
        return b""

    def token_chunk(self, entry: Entry) -> bytes:
        offset, text = self.offset, entry.text
        self.offset += len(text)
        entries = self.add(entry)
        logprobs = self._logprobs(entries, offset) if entries else None
        payload = {"content": text} if self.kind == "chat" else text
        chunk = self._chunk(payload, logprobs, None)
        if self._holding():
            self.held.append(chunk)
            return b""
        released, self.held = b"".join(self.held), []
        return released + chunk

    def final_chunks(self, final: FinalEvent) -> bytes:
        """The choice's last chunks (tool calls, finish reason, an error); the stream's
        end (usage, [DONE]) is :func:`stream_end`'s, once every choice has ended."""
        calls = self.tool_calls()
        out = b"".join(self.held) if calls is None else self._tool_call_chunk(calls)
        self.held = []
        payload = {} if self.kind == "chat" else ""
        out += self._chunk(payload, None, self.finish_reason(final, calls))
        error = failure(final)
        if error is not None:
            out += _data(ErrorResponse(error=error.detail).model_dump(mode="json"))
        return out

    def error_chunk(self, detail: ErrorDetail) -> bytes:
        return _data(ErrorResponse(error=detail).model_dump(mode="json")) + DONE

    def _holding(self) -> bool:
        """Tool-call replies are held until they end: required and named ones always, an
        auto one while it may still be a JSON object."""
        if self.tools is None or not self.tools.active:
            return False
        if self.tools.mode != "auto":
            return True
        stripped = self.text.lstrip()
        return not stripped or stripped.startswith("{")

    def tool_calls(self) -> list[dict[str, Any]] | None:
        if self.tools is None:
            return None
        return parse_tool_calls(self.text, self.tools, f"{self.request_id}_{self.index}")

    def finish_reason(self, final: FinalEvent, calls: list[dict[str, Any]] | None) -> str:
        """OpenAI gives tool_calls when the model chose to call (not for a named choice)."""
        if calls and self.tools is not None and self.tools.mode != "named":
            return "tool_calls"
        return final.finish_reason.value

    def _tool_call_chunk(self, calls: list[dict[str, Any]]) -> bytes:
        deltas = [{"index": i, **call} for i, call in enumerate(calls)]
        return self._chunk({"tool_calls": deltas}, None, None)

    def head(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _chunk(self, payload: Any, logprobs: Any, finish: str | None) -> bytes:
        choice = {"index": self.index, "logprobs": logprobs, "finish_reason": finish}
        choice["delta" if self.kind == "chat" else "text"] = payload
        extra = {"usage": None} if self.include_usage else {}
        return _data({**self.head(), "choices": [choice], **extra})

    def _logprobs(self, entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
        if self.kind == "chat":
            return ChoiceLogprobs(content=entries).model_dump(mode="json")
        return _text_logprobs(entries, [offset] * len(entries)).model_dump(mode="json")

    # Whole responses.
    def chat_choice(self, final: FinalEvent, want_logprobs: bool) -> ChatChoice:
        calls = self.tool_calls()
        message = (
            AssistantMessage(content=self.text)
            if calls is None
            else AssistantMessage(
                content=None, tool_calls=[ToolCall.model_validate(c) for c in calls]
            )
        )
        return ChatChoice(
            index=self.index,
            message=message,
            logprobs=ChoiceLogprobs(content=self.logprobs) if want_logprobs else None,
            finish_reason=self.finish_reason(final, calls),
        )

    def completion_choice(self, final: FinalEvent, want_logprobs: bool) -> CompletionChoice:
        offsets, at = [], 0
        for part in self.text_parts:
            offsets.append(at)
            at += len(part)
        return CompletionChoice(
            index=self.index,
            text=self.text,
            logprobs=_text_logprobs(self.logprobs, offsets) if want_logprobs else None,
            finish_reason=final.finish_reason.value,
        )

    def chat_completion(self, final: FinalEvent, want_logprobs: bool) -> ChatCompletion:
        return chat_completion([self], [final], want_logprobs)

    def completion(self, final: FinalEvent, want_logprobs: bool) -> Completion:
        return completion([self], [final], want_logprobs)


def total_usage(finals: list[FinalEvent]) -> CompletionUsage:
    """n choices of one prompt: the prompt counted once, the completions summed."""
    prompt = finals[0].usage.prompt_tokens if finals else 0
    completion_tokens = sum(f.usage.completion_tokens for f in finals)
    return CompletionUsage(
        prompt_tokens=prompt,
        completion_tokens=completion_tokens,
        total_tokens=prompt + completion_tokens,
    )


def stream_end(renderer: Renderer, finals: list[FinalEvent]) -> bytes:
    """After every choice's final chunks: the usage chunk (when asked for), then [DONE]."""
    if not renderer.include_usage:
        return DONE
    usage = total_usage(finals).model_dump()
    return _data({**renderer.head(), "choices": [], "usage": usage}) + DONE


def chat_completion(
    renderers: list[Renderer], finals: list[FinalEvent], want_logprobs: bool
) -> ChatCompletion:
    first = renderers[0]
    return ChatCompletion(
        id=first.id,
        created=first.created,
        model=first.model,
        choices=[r.chat_choice(f, want_logprobs) for r, f in zip(renderers, finals, strict=True)],
        usage=total_usage(finals),
    )


def completion(
    renderers: list[Renderer], finals: list[FinalEvent], want_logprobs: bool
) -> Completion:
    first = renderers[0]
    choices = [
        r.completion_choice(f, want_logprobs) for r, f in zip(renderers, finals, strict=True)
    ]
    return Completion(
        id=first.id,
        created=first.created,
        model=first.model,
        choices=choices,
        usage=total_usage(finals),
    )


def _text_logprobs(entries: list[TokenLogprob], offsets: list[int]) -> CompletionLogprobs:
    # Offsets are per event; when an event holds several tokens they share its offset.
    offsets = (offsets + [offsets[-1] if offsets else 0] * len(entries))[: len(entries)]
    return CompletionLogprobs(
        tokens=[e.token for e in entries],
        token_logprobs=[e.logprob for e in entries],
        top_logprobs=[{t.token: t.logprob for t in e.top_logprobs} for e in entries],
        text_offset=offsets,
    )
