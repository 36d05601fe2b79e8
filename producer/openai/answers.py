"""The parts of OpenAI answers that do not depend on one choice: SSE frames, usage, and
logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from producer.openai.responses import (
    CompletionLogprobs,
    CompletionTokensDetails,
    CompletionUsage,
    TokenLogprob,
    TopLogprob,
)
from shared.models import FinalEvent, TokenEvent

DONE = b"data: [DONE]\n\n"


def sse_data(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def total_usage(
    finals: Sequence[FinalEvent],
    prompt_indexes: Sequence[int] = (),
    reasoning_tokens: Sequence[int | None] = (),
) -> CompletionUsage:
    """Each prompt counted once (choice i's prompt is ``prompt_indexes[i]``, 0 when not
    given: n choices share one), the completions summed, and the reasoning tokens of
    the choices that counted them."""
    prompts: dict[int, int] = {}
    for i, final in enumerate(finals):
        index = prompt_indexes[i] if prompt_indexes else 0
        prompts.setdefault(index, final.usage.prompt_tokens)
    prompt_tokens = sum(prompts.values())
    completion_tokens = sum(f.usage.completion_tokens for f in finals)
    counted = [n for n in reasoning_tokens if n is not None]
    details = CompletionTokensDetails(reasoning_tokens=sum(counted)) if counted else None
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        completion_tokens_details=details,
    )


def text_logprobs(entries: list[TokenLogprob], offsets: list[int]) -> CompletionLogprobs:
    # Offsets are per event; when an event holds several tokens they share its offset.
    offsets = (offsets + [offsets[-1] if offsets else 0] * len(entries))[: len(entries)]
    return CompletionLogprobs(
        tokens=[e.token for e in entries],
        token_logprobs=[e.logprob for e in entries],
        top_logprobs=[{t.token: t.logprob for t in e.top_logprobs} for e in entries],
        text_offset=offsets,
    )


def token_logprobs(event: TokenEvent) -> list[TokenLogprob]:
    """The event's per-token logprobs, step by step when it is a coalesced one."""
    return [logprob for step in event.split() for logprob in _step_logprobs(step)]


def _step_logprobs(event: TokenEvent) -> list[TokenLogprob]:
    """A step's per-token logprobs, each token named by its text and bytes as the
    worker decoded it alone. Entries from a worker that did not name them: the step's
    text for its own token when the step produced one, else ``token_id:<id>`` (as
    vLLM's option reads)."""
    single = len(event.token_ids) == 1

    def named(entry: dict[str, Any]) -> dict[str, Any]:
        token_id = int(entry["token_id"])
        token = entry.get("token")
        if token is None:
            if not (single and token_id == event.token_ids[0]):
                return {"token": f"token_id:{token_id}", "logprob": entry["logprob"]}
            token = event.text
        raw = entry.get("bytes")
        return {"token": token, "logprob": entry["logprob"],
                "bytes": list(token.encode()) if raw is None else raw}  # fmt: skip

    return [
        TokenLogprob(**named(e), top_logprobs=[TopLogprob(**named(t)) for t in e.get("top", ())])
        for e in event.logprobs or ()
    ]
