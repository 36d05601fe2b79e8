"""tokenq stream events to OpenAI responses: streamed chunks and whole completions.

Chunks are built as plain dicts on the hot path (one per token per stream); the
pydantic models in ``openai_schemas`` document them and the tests check they agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from producer.gateway.entries import Entry
from producer.gateway.errors import ApiError, ErrorDetail, ErrorResponse
from producer.gateway.openai_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionUsage,
    TokenLogprob,
    TopLogprob,
)
from shared.models import FinalEvent, FinishReason, TokenEvent

DONE = b"data: [DONE]\n\n"
Kind = Literal["chat", "text"]


def _data(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def token_logprobs(event: TokenEvent) -> list[TokenLogprob]:
    """The event's per-token logprobs; a token's text is known alone only when the
    event holds one token, else it reads ``token_id:<id>`` (as vLLM's option does)."""
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


def usage_of(final: FinalEvent) -> CompletionUsage:
    u = final.usage
    return CompletionUsage(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        total_tokens=u.total_tokens,
    )


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
    """Accumulates one request's events and renders them the OpenAI way."""

    kind: Kind
    request_id: str
    model: str
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    text_parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    offset: int = 0

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.request_id

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
        return self._chunk(payload, logprobs, None)

    def final_chunks(self, final: FinalEvent) -> bytes:
        out = self._chunk({} if self.kind == "chat" else "", None, final.finish_reason.value)
        error = failure(final)
        if error is not None:
            out += _data(ErrorResponse(error=error.detail).model_dump(mode="json"))
        if self.include_usage:
            out += _data({**self._head(), "choices": [], "usage": usage_of(final).model_dump()})
        return out + DONE

    def error_chunk(self, detail: ErrorDetail) -> bytes:
        return _data(ErrorResponse(error=detail).model_dump(mode="json")) + DONE

    def _head(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _chunk(self, payload: Any, logprobs: Any, finish: str | None) -> bytes:
        choice = {"index": 0, "logprobs": logprobs, "finish_reason": finish}
        choice["delta" if self.kind == "chat" else "text"] = payload
        extra = {"usage": None} if self.include_usage else {}
        return _data({**self._head(), "choices": [choice], **extra})

    def _logprobs(self, entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
        if self.kind == "chat":
            return ChoiceLogprobs(content=entries).model_dump(mode="json")
        return _text_logprobs(entries, [offset] * len(entries)).model_dump(mode="json")

    # Whole responses.
    def chat_completion(self, final: FinalEvent, want_logprobs: bool) -> ChatCompletion:
        choice = ChatChoice(
            message=AssistantMessage(content="".join(self.text_parts)),
            logprobs=ChoiceLogprobs(content=self.logprobs) if want_logprobs else None,
            finish_reason=final.finish_reason.value,
        )
        return ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[choice],
            usage=usage_of(final),
        )

    def completion(self, final: FinalEvent, want_logprobs: bool) -> Completion:
        offsets, at = [], 0
        for part in self.text_parts:
            offsets.append(at)
            at += len(part)
        logprobs = _text_logprobs(self.logprobs, offsets) if want_logprobs else None
        choice = CompletionChoice(
            text="".join(self.text_parts),
            logprobs=logprobs,
            finish_reason=final.finish_reason.value,
        )
        return Completion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[choice],
            usage=usage_of(final),
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
