"""A batch line's answer rendered by the live routes' own renderer, so an output line's
body is what ``/v1/chat/completions``, ``/v1/completions`` or ``/v1/responses`` would
have answered."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from producer.batch.lines import BatchLine
from producer.openai.output import Kind, Renderer, chat_completion, completion
from producer.responses.events import build
from producer.responses.record import StoredResponse
from producer.streams.entries import Entry, parse_entry
from shared.models import FinalEvent, Result, TokenEvent, dumps


def completion_body(
    line: BatchLine, results: Sequence[Result], streams: Sequence[Sequence[Entry]] | None
) -> dict[str, Any]:
    """One choice per result; ``streams`` (each request's events) carry the logprobs of a
    line that asked for them and the token counts of reasoning, else the results' texts
    are the answer."""
    kind: Kind = "chat" if line.kind == "chat" else "text"
    first = results[0]
    renderers = [
        Renderer(kind, first.id, first.model, index=i, tools=line.tools, reasoning=line.reasoning)
        for i in range(len(results))
    ]
    for i, (renderer, result) in enumerate(zip(renderers, results, strict=True)):
        if streams is None:
            renderer.text_parts.append(result.text)
        else:
            for entry in streams[i]:
                if not entry.is_final:
                    renderer.add(entry)
    finals = [_final(result) for result in results]
    if kind == "chat":
        return chat_completion(renderers, finals, line.logprobs).model_dump(mode="json")
    return completion(renderers, finals, line.logprobs).model_dump(mode="json")


def _final(result: Result) -> FinalEvent:
    return FinalEvent(
        finish_reason=result.finish_reason,
        usage=result.usage,
        timings=result.timings,
        error=result.error,
        refusal=result.refusal,
    )


def response_body(
    line: BatchLine, result: Result, stream: Sequence[Entry] | None
) -> dict[str, Any]:
    """The response object ``/v1/responses`` would have answered: read from the request's
    events (``stream``, when the line's reasoning tokens are counted), else its result."""
    if line.response is None:
        raise ValueError(f"line {line.custom_id!r} is not a /v1/responses line")
    created_at = round(time.time() - (result.timings.total_s or 0.0), 3)
    record = StoredResponse.model_validate(line.response).stored(result.id, created_at)
    entries = list(stream) if stream is not None else _as_text(result)
    if not entries or not entries[-1].is_final:
        entries.append(parse_entry("0-0", {b"e": dumps(_final(result))}))
    _, builder = build(record, entries)
    return builder.snapshot()


def _as_text(result: Result) -> list[Entry]:
    token = TokenEvent(index=0, token_ids=result.token_ids, text=result.text)
    return [parse_entry("0-0", {b"e": token.wire()})] if result.text else []
