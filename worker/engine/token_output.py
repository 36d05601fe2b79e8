"""Each sampled token as its request's output: finish checks, text, stop strings.

This runs for every row of every step, so each request keeps what its checks need
from one step to the next (its text state and the ids that end it) rather than
working them out again per token.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from shared.models import FinishReason
from worker.engine.detokenizer import (
    IncrementalDetokenizer,
    StopStringMatcher,
    Tokenizer,
    TokenNames,
    TokenTexts,
)
from worker.engine.outputs import RequestOutput
from worker.engine.request import Sequence
from worker.engine.resume import resume_text_state


class TextState:
    """One request's incremental detokenizer and stop-string matcher, and the token
    ids that end it (its stop ids, and EOS unless it ignores EOS)."""

    __slots__ = ("detokenizer", "stop", "stop_ids")

    def __init__(
        self,
        tokenizer: Tokenizer,
        seq: Sequence,
        eos_token_ids: Collection[int],
        texts: TokenTexts | None = None,
    ) -> None:
        req, params = seq.request, seq.sampling
        self.detokenizer: IncrementalDetokenizer
        self.stop: StopStringMatcher
        self.detokenizer, self.stop = resume_text_state(
            tokenizer,
            req.prompt_token_ids,
            req.output_token_ids,
            req.output_text,
            params.stop,
            texts,
        )
        ending = set(params.stop_token_ids)
        if not params.ignore_eos:
            ending.update(eos_token_ids)
        self.stop_ids = frozenset(ending)


class TokenOutputs:
    """The text states of the requests in the engine, and each new token's output."""

    def __init__(
        self, tokenizer: Tokenizer, eos_token_ids: Collection[int], max_model_len: int
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.texts: dict[str, TextState] = {}
        self.token_texts = TokenTexts.of(tokenizer)
        self.token_names = TokenNames(tokenizer)  # for logprobs, decoded as asked for

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.texts

    def start(self, seq: Sequence) -> None:
        self.texts[seq.request_id] = TextState(
            self.tokenizer, seq, self.eos_token_ids, self.token_texts
        )

    def end(self, request_id: str) -> None:
        self.texts.pop(request_id, None)

    def output(
        self, seq: Sequence, logprobs: dict[str, Any] | None, index: int | None = None
    ) -> RequestOutput:
        """The output for ``seq``'s token at ``index`` (default: its last); its
        ``finish_reason`` is set when that token ends the request (the caller ends it)."""
        token_ids = seq.token_ids
        index = len(token_ids) - 1 if index is None else index
        token_id = token_ids[index]
        num_output_tokens = index + 1 - seq.num_prompt_tokens
        params = seq.request.sampling
        if num_output_tokens > params.max_tokens:
            # A run that only scores its prompt (max_tokens 0, or resumed with every
            # token it may generate): it ends with its prefill, this token unused.
            return _scored_only(seq, num_output_tokens - 1)
        state = self.texts[seq.request.request_id]
        reason = _token_finish_reason(seq, token_id, state)
        delta = "" if reason is not None else state.detokenizer.add([token_id])
        text, stopped = state.stop.add(delta, num_output_tokens >= params.min_tokens)
        if stopped:
            reason = FinishReason.STOP
        elif reason is None and (
            num_output_tokens >= params.max_tokens or index + 1 >= self.max_model_len
        ):
            reason = FinishReason.LENGTH
        if reason is not None and not stopped:
            text += state.stop.flush()
        return RequestOutput(
            seq.request.request_id,
            num_output_tokens - 1,
            [token_id],
            text,
            reason,
            None if logprobs is None else [self._named(logprobs)],
            seq.num_prompt_tokens,
            num_output_tokens,
            stop_sequence=state.stop.matched if stopped else None,
        )

    def _named(self, logprobs: dict[str, Any]) -> dict[str, Any]:
        """``logprobs`` (the sampler's entry) with the text of its token and of each
        alternative, and their bytes where the text is part of a character: the
        producer side has no tokenizer to name them."""
        for entry in (logprobs, *logprobs.get("top", ())):
            text, raw = self.token_names[int(entry["token_id"])]
            entry["token"] = text
            if raw is not None:
                entry["bytes"] = raw
        return logprobs


def _scored_only(seq: Sequence, num_output_tokens: int) -> RequestOutput:
    return RequestOutput(
        seq.request.request_id,
        num_output_tokens,
        [],
        "",
        FinishReason.LENGTH,
        None,
        seq.num_prompt_tokens,
        num_output_tokens,
    )


def _token_finish_reason(seq: Sequence, token_id: int, state: TextState) -> FinishReason | None:
    if token_id in state.stop_ids:
        return FinishReason.STOP
    grammar = seq.request.grammar
    if grammar is not None and (not grammar.accept(token_id) or grammar.terminated):
        return FinishReason.STOP  # the output is complete (or the grammar is stuck)
    return None
