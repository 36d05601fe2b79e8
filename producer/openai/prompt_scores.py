"""Scoring a prompt on the OpenAI routes: completions' ``echo`` (with ``logprobs``, and
``max_tokens: 0`` to generate nothing) and vLLM's ``prompt_logprobs`` extension, from
the prompt logprobs a worker puts in the final event (``FinalEvent.prompt_logprobs``).

``echo`` puts the prompt before the completion's text, and with ``logprobs`` its tokens
before the completion's (the first prompt token's logprob null, as OpenAI's and vLLM's).
A text prompt is echoed as given; a token-id prompt as its tokens' text. The worker
scores the prompt only where that is needed: logprobs asked for, nothing generated, or
a token-id prompt to spell. ``prompt_logprobs: k`` gives, per prompt token, vLLM's
``{token_id: {logprob, rank, decoded_token}}`` for the token and the ``k`` likeliest:
on each choice of a completion, at the top of a chat completion (as vLLM places it).
Neither is streamed: the scores come with the request's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from producer.openai.answers import text_logprobs
from producer.openai.errors import invalid
from producer.openai.responses import CompletionLogprobs, PromptLogprob, TokenLogprob, TopLogprob
from producer.openai.schemas import CompletionRequest, GenerationBody
from shared.models import MAX_PROMPT_LOGPROBS_TOKENS

Scores = Sequence[dict[str, Any]]
VllmScores = list[dict[str, PromptLogprob] | None]


def check_scoring(body: GenerationBody) -> None:
    """What no route streams: echo and prompt_logprobs (a 400 naming ``stream``)."""
    echo = isinstance(body, CompletionRequest) and body.echo
    if body.stream and (echo or body.prompt_logprobs is not None):
        asked = "echo" if echo else "prompt_logprobs"
        raise invalid(
            f"stream: {asked} is not streamed (the prompt's scores come with the request's "
            "end); send stream: false",
            "stream",
            "unsupported",
        )


def completion_sampling(
    body: CompletionRequest, prompt: dict[str, Any], sampling: dict[str, Any]
) -> dict[str, Any]:
    """``sampling`` for one prompt of ``body``, asking the prompt's scores where echo or
    prompt_logprobs need them; a 400 naming the field for what cannot be scored."""
    asked = [] if body.prompt_logprobs is None else [body.prompt_logprobs]
    ids = prompt.get("prompt_token_ids")
    if body.echo and (body.logprobs is not None or body.max_tokens == 0 or ids is not None):
        asked.append(body.logprobs or 0)
    if body.max_tokens == 0 and not asked:
        raise invalid(
            "max_tokens: 0 generates nothing, which only scoring the prompt asks for: give "
            "echo: true (with logprobs for its tokens' logprobs) or prompt_logprobs, or "
            "max_tokens >= 1",
            "max_tokens",
        )
    if not asked:
        return sampling
    if ids is not None and len(ids) > MAX_PROMPT_LOGPROBS_TOKENS:
        param = "prompt_logprobs" if body.prompt_logprobs is not None else "echo"
        raise invalid(
            f"{param}: the prompt is {len(ids)} tokens; its logprobs are given for at most "
            f"{MAX_PROMPT_LOGPROBS_TOKENS} prompt tokens a request",
            param,
        )
    return {**sampling, "prompt_logprobs": max(asked)}


@dataclass(frozen=True)
class PromptView:
    """How one choice shows its prompt: ``echo`` it (``text``: a text prompt as given,
    None: spelled from its tokens), with its tokens' logprobs and ``echo_top``
    alternatives when ``echo_top`` is set; ``vllm_top``: vLLM's prompt_logprobs."""

    echo: bool = False
    text: str | None = None
    echo_top: int | None = None
    vllm_top: int | None = None

    def echoed(self, scores: Scores | None) -> str:
        if not self.echo:
            return ""
        if self.text is not None:
            return self.text
        return spelled(scores or ())

    def echo_logprobs(self, scores: Scores | None) -> CompletionLogprobs | None:
        """The prompt's part of a completion's logprobs (None when not echoed)."""
        if not self.echo or self.echo_top is None or scores is None:
            return None
        return echo_logprobs(scores, self.echo_top)

    def vllm(self, scores: Scores | None) -> VllmScores | None:
        return (
            None if self.vllm_top is None or scores is None else vllm_scores(scores, self.vllm_top)
        )


def completion_view(body: CompletionRequest, prompt_text: str | None) -> PromptView:
    """One choice's view of its prompt (``prompt_text``: None for a token-id prompt)."""
    return PromptView(body.echo, prompt_text, body.logprobs, body.prompt_logprobs)


def _name(entry: dict[str, Any]) -> str:
    token = entry.get("token")
    return f"token_id:{entry['token_id']}" if token is None else str(token)


def _raw(entry: dict[str, Any]) -> bytes:
    raw = entry.get("bytes")
    return _name(entry).encode() if raw is None else bytes(raw)


def spelled(scores: Scores) -> str:
    """A token-id prompt's text: its tokens' bytes joined (a character split across tokens
    is whole again)."""
    return b"".join(_raw(e) for e in scores).decode(errors="replace")


def echo_logprobs(scores: Scores, num_top: int) -> CompletionLogprobs:
    """The prompt's tokens, their logprobs (the first's null, as OpenAI's) and ``num_top``
    alternatives each, their offsets in the echoed text."""
    entries = [_token_logprob(e, num_top) for e in scores[1:]]
    first = _name(scores[0]) if scores else ""
    offsets, at = [], len(first)
    for entry in entries:
        offsets.append(at)
        at += len(entry.token)
    logprobs = text_logprobs(entries, offsets)
    return CompletionLogprobs(
        tokens=[first, *logprobs.tokens] if scores else [],
        token_logprobs=[None, *logprobs.token_logprobs] if scores else [],
        top_logprobs=[None, *(logprobs.top_logprobs or [])] if scores else [],
        text_offset=[0, *logprobs.text_offset] if scores else [],
    )


def _token_logprob(entry: dict[str, Any], num_top: int) -> TokenLogprob:
    top = [TopLogprob(token=_name(t), logprob=t["logprob"]) for t in entry["top"][:num_top]]
    return TokenLogprob(token=_name(entry), logprob=entry["logprob"], top_logprobs=top)


def vllm_scores(scores: Scores, num_top: int) -> VllmScores:
    """vLLM's prompt_logprobs: per prompt token (the first None) the token and the
    ``num_top`` likeliest, keyed by token id."""
    out: VllmScores = []
    for entry in scores:
        if entry.get("logprob") is None:
            out.append(None)
            continue
        ranked = {
            str(t["token_id"]): PromptLogprob(
                logprob=t["logprob"], rank=rank, decoded_token=_name(t)
            )
            for rank, t in enumerate(entry["top"][:num_top], start=1)
        }
        ranked[str(entry["token_id"])] = PromptLogprob(
            logprob=entry["logprob"], rank=entry["rank"], decoded_token=_name(entry)
        )
        out.append(ranked)
    return out


def joined(
    prompt: CompletionLogprobs | None, completion: CompletionLogprobs | None
) -> CompletionLogprobs | None:
    """The echoed prompt's logprobs, then the completion's (whose offsets count the
    echoed prompt already)."""
    if prompt is None or completion is None:
        return completion if prompt is None else prompt
    return CompletionLogprobs(
        tokens=prompt.tokens + completion.tokens,
        token_logprobs=prompt.token_logprobs + completion.token_logprobs,
        top_logprobs=[*(prompt.top_logprobs or []), *(completion.top_logprobs or [])],
        text_offset=prompt.text_offset + completion.text_offset,
    )
