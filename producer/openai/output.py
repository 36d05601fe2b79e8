"""tokenq stream events to OpenAI responses: streamed chunks and whole completions.

Chunks are built as plain dicts on the hot path (one per token per stream); the
pydantic models in ``responses`` document them and the tests check they agree. A chat
reply is read by ``reply.ReplyReader``: reasoning, text and tool calls come apart, in
chunks of their own while streaming.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from producer.openai.answers import DONE, sse_data, text_logprobs, token_logprobs, total_usage
from producer.openai.errors import ApiError, ErrorDetail, ErrorResponse
from producer.openai.prompt_scores import PromptView, joined
from producer.openai.reasoning import ReasoningPlan
from producer.openai.reply import Delta, ReplyReader
from producer.openai.responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionUsage,
    TokenLogprob,
)
from producer.openai.schemas import ToolCall
from producer.openai.tools import ToolPlan
from producer.refusals import refusal_of
from producer.streams.entries import Entry
from shared.models import FinalEvent, FinishReason

Kind = Literal["chat", "text"]
# The native fields a worker's refusal may name, as each OpenAI route calls them.
PARAM_NAMES: dict[str, Mapping[str, str]] = {
    "chat": {
        "prompt": "messages",
        "prompt_token_ids": "messages",
        "guided_json": "response_format",
        "guided_structural_tag": "response_format",
        "lora": "model",
    },
    "text": {"prompt_token_ids": "prompt", "lora": "model"},
    "embeddings": {"prompt": "input", "prompt_token_ids": "input", "lora": "model"},
}


def failure(final: FinalEvent, api: str = "chat") -> ApiError | None:
    """The error a request that produced no answer gets (expired, failed): a 400 naming
    the field for what the worker refused (``api``'s names), else a 500."""
    refusal = refusal_of(final)
    if refusal is not None:
        param = refusal.param_in(PARAM_NAMES.get(api, {}))
        return ApiError(400, refusal.message, param=param, code=refusal.code)
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
    choice's, ``prompt_index`` its prompt's (a completions call may send several);
    ``tools`` and ``reasoning`` say how to read a chat reply."""

    kind: Kind
    request_id: str
    model: str
    include_usage: bool = False
    index: int = 0
    tools: ToolPlan | None = None
    reasoning: ReasoningPlan | None = None
    prompt_index: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    text_parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    offset: int = 0
    # Each engine step's tokens and the text offset it ends at (to count reasoning tokens).
    steps: list[tuple[int, int]] = field(default_factory=list)
    reader: ReplyReader | None = None  # the streamed reply's
    unsent_logprobs: list[TokenLogprob] = field(default_factory=list)  # of text still held
    num_calls_sent: int = 0
    prompt: PromptView = field(
        default_factory=PromptView
    )  # echo and vLLM's prompt_logprobs (prompt_scores)

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.request_id

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def add(self, entry: Entry) -> list[TokenLogprob]:
        self.text_parts.append(entry.text)
        self._add_steps(entry.fields)
        entries = token_logprobs(entry.token()) if entry.fields.get("logprobs") else []
        self.logprobs.extend(entries)
        return entries

    def _add_steps(self, fields: dict[str, Any]) -> None:
        steps = fields.get("steps") or [(len(fields.get("token_ids") or ()), len(fields["text"]))]
        end = self.steps[-1][1] if self.steps else 0
        for num_tokens, num_chars in steps:
            end += num_chars
            self.steps.append((num_tokens, end))

    def new_reader(self) -> ReplyReader:
        return ReplyReader(self.tools, self.reasoning, f"{self.request_id}_{self.index}")

    def reasoning_tokens(self, reader: ReplyReader | None = None) -> int | None:
        """How many of the reply's tokens were reasoning (None without a reasoning model)."""
        reader = reader or self.reader or self._read_whole()[0]
        end = reader.reasoning_end()
        if end is None:
            return None
        starts = [0] + [at for _, at in self.steps[:-1]]
        return sum(n for (n, _), start in zip(self.steps, starts, strict=True) if start < end)

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
        if self.kind == "text":
            logprobs = text_logprobs(entries, [offset] * len(entries)) if entries else None
            dumped = None if logprobs is None else logprobs.model_dump(mode="json")
            return self._chunk(text, dumped, None)
        if self.reader is None:
            self.reader = self.new_reader()
        self.unsent_logprobs.extend(entries)
        return self._delta_chunks(self.reader.feed(text))

    def final_chunks(self, final: FinalEvent) -> bytes:
        """The choice's last chunks (what was held, the finish reason, an error); the
        stream's end (usage, [DONE]) is :func:`stream_end`'s, once every choice has ended."""
        out = b""
        if self.kind == "chat":
            self.reader = self.reader or self.new_reader()
            out = self._delta_chunks(self.reader.finish(final.finish_reason is FinishReason.LENGTH))
            if self.unsent_logprobs:  # of tokens with no text of their own (EOS...)
                out += self._chunk({"content": ""}, self._take_logprobs(), None)
        payload = {} if self.kind == "chat" else ""
        out += self._chunk(payload, None, self.finish_reason(final, self.num_calls_sent))
        error = failure(final, self.kind)
        if error is not None:
            out += sse_data(ErrorResponse(error=error.detail).model_dump(mode="json"))
        return out

    def error_chunk(self, detail: ErrorDetail) -> bytes:
        return sse_data(ErrorResponse(error=detail).model_dump(mode="json")) + DONE

    def _delta_chunks(self, delta: Delta) -> bytes:
        out = b""
        if delta.reasoning:
            reasoning = {"reasoning_content": delta.reasoning, "reasoning": delta.reasoning}
            out += self._chunk(reasoning, self._take_logprobs(), None)
        if delta.content:
            out += self._chunk({"content": delta.content}, self._take_logprobs(), None)
        if delta.calls:
            first, self.num_calls_sent = self.num_calls_sent, self.num_calls_sent + len(delta.calls)
            calls = [{"index": first + i, **call} for i, call in enumerate(delta.calls)]
            out += self._chunk({"tool_calls": calls}, None, None)
            self.unsent_logprobs = []  # calls carry no logprobs, as OpenAI's do not
        return out

    def _take_logprobs(self) -> dict[str, Any] | None:
        if not self.unsent_logprobs:
            return None
        entries, self.unsent_logprobs = self.unsent_logprobs, []
        return ChoiceLogprobs(content=entries).model_dump(mode="json")

    def finish_reason(self, final: FinalEvent, num_calls: int) -> str:
        """OpenAI gives tool_calls when the model chose to call and ended (not for a named
        choice); a reply cut short keeps ``length``."""
        named = self.tools is not None and self.tools.mode == "named"
        if num_calls and not named and final.finish_reason is FinishReason.STOP:
            return "tool_calls"
        return final.finish_reason.value

    def head(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _chunk(self, payload: Any, logprobs: Any, finish: str | None) -> bytes:
        choice = {"index": self.index, "logprobs": logprobs, "finish_reason": finish}
        choice["delta" if self.kind == "chat" else "text"] = payload
        extra = {"usage": None} if self.include_usage else {}
        return sse_data({**self.head(), "choices": [choice], **extra})

    # Whole responses.
    def _read_whole(self, cut_off: bool = False) -> tuple[ReplyReader, Delta]:
        reader = self.new_reader()
        delta = reader.feed(self.text)
        delta += reader.finish(cut_off)
        return reader, delta

    def chat_choice(self, final: FinalEvent, want_logprobs: bool) -> ChatChoice:
        _, delta = self._read_whole(final.finish_reason is FinishReason.LENGTH)
        calls = [ToolCall.model_validate(c) for c in delta.calls] or None
        content = delta.content if calls is None or delta.content.strip() else None
        reasoning = delta.reasoning if self.reasoning is not None and delta.reasoning else None
        message = AssistantMessage(
            content=content, reasoning_content=reasoning, reasoning=reasoning, tool_calls=calls
        )
        return ChatChoice(
            index=self.index,
            message=message,
            logprobs=ChoiceLogprobs(content=self.logprobs) if want_logprobs else None,
            finish_reason=self.finish_reason(final, len(delta.calls)),
        )

    def completion_choice(self, final: FinalEvent, want_logprobs: bool) -> CompletionChoice:
        scores, echoed = final.prompt_logprobs, self.prompt.echoed(final.prompt_logprobs)
        offsets, at = [], len(echoed)
        for part in self.text_parts:
            offsets.append(at)
            at += len(part)
        logprobs = text_logprobs(self.logprobs, offsets) if want_logprobs else None
        return CompletionChoice(
            index=self.index,
            text=echoed + self.text,
            logprobs=joined(self.prompt.echo_logprobs(scores), logprobs),
            finish_reason=final.finish_reason.value,
            prompt_logprobs=self.prompt.vllm(scores),
        )


def usage_of(renderers: Sequence[Renderer], finals: Sequence[FinalEvent]) -> CompletionUsage:
    reasoning = [r.reasoning_tokens() if r.kind == "chat" else None for r in renderers]
    return total_usage(finals, [r.prompt_index for r in renderers], reasoning)


def stream_end(renderers: Sequence[Renderer], finals: Sequence[FinalEvent]) -> bytes:
    """After every choice's final chunks: the usage chunk (when asked for), then [DONE]."""
    first = renderers[0]
    if not first.include_usage:
        return DONE
    usage = usage_of(renderers, finals).model_dump(mode="json")
    return sse_data({**first.head(), "choices": [], "usage": usage}) + DONE


def chat_completion(
    renderers: list[Renderer], finals: list[FinalEvent], want_logprobs: bool
) -> ChatCompletion:
    first = renderers[0]
    return ChatCompletion(
        id=first.id,
        created=first.created,
        model=first.model,
        choices=[r.chat_choice(f, want_logprobs) for r, f in zip(renderers, finals, strict=True)],
        usage=usage_of(renderers, finals),
        prompt_logprobs=first.prompt.vllm(finals[0].prompt_logprobs),  # at the top, as vLLM's
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
        usage=usage_of(renderers, finals),
    )
