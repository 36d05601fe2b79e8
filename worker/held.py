"""What a worker knows about each request it holds: its lease and what it published
(where the request stands is ``worker.ledger``'s)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from shared.models import FinalEvent, FinishReason, GenerationRequest, RequestState, Usage
from shared.refusal import Refusal

STATE_OF_REASON = {
    FinishReason.STOP: RequestState.FINISHED,
    FinishReason.LENGTH: RequestState.FINISHED,
    FinishReason.TIMEOUT: RequestState.FINISHED,
    FinishReason.CANCELLED: RequestState.CANCELLED,
    FinishReason.EXPIRED: RequestState.EXPIRED,
    FinishReason.ERROR: RequestState.FAILED,
}


@dataclass
class Held:
    """A claimed request: its lease token and the output published so far."""

    request_id: str
    lease_token: str
    request: GenerationRequest
    num_prompt_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    last_token_s: float | None = None
    # Its prefix fingerprints (with prefix affinity on): published as warm while it is
    # held, since its prefill puts them in the cache.
    fingerprints: tuple[str, ...] = ()
    # Its prefix-cache lookups here (from the engine's last output for it): tokens
    # queried and found cached, for its tenant's figures.
    num_prefix_queried_tokens: int = 0
    num_prefix_hit_tokens: int = 0

    def record(self, token_ids: list[int], text: str) -> None:
        self.token_ids.extend(token_ids)
        self.text_parts.append(text)

    def output_json(self, more_ids: list[int] = (), more_text: str = "") -> bytes:  # type: ignore[assignment]
        """The result's text and ids, with this step's not yet recorded tokens."""
        text = "".join(self.text_parts) + more_text
        return orjson.dumps({"text": text, "token_ids": [*self.token_ids, *more_ids]})

    def final(
        self,
        reason: FinishReason,
        num_more: int = 0,
        error: str | None = None,
        embedding: list[float] | None = None,
        prompt_logprobs: list[dict[str, Any]] | None = None,
        stop_sequence: str | None = None,
        refusal: Refusal | None = None,
    ) -> FinalEvent:
        usage = Usage(
            prompt_tokens=self.num_prompt_tokens, completion_tokens=len(self.token_ids) + num_more
        )
        vector = None if embedding is None else tuple(embedding)
        scores = None if prompt_logprobs is None else tuple(prompt_logprobs)
        return FinalEvent(
            finish_reason=reason,
            usage=usage,
            error=error,
            embedding=vector,
            prompt_logprobs=scores,
            stop_sequence=stop_sequence,
            refusal=refusal,
        )
