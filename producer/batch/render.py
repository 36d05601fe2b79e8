"""A batch line's answer rendered by the live routes' own renderer, so an output line's
body is what ``/v1/chat/completions`` or ``/v1/completions`` would have answered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producer.batch.lines import BatchLine
from producer.gateway.entries import Entry
from producer.openai.output import Kind, Renderer, chat_completion, completion
from shared.models import FinalEvent, Result


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
    )
