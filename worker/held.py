"""What a worker knows about each request it holds."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from shared.models import FinalEvent, FinishReason, GenerationRequest, RequestState, Usage

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
    aborting: bool = False
    # Its finish is in a write (sent, or to be sent again): that write's reply settles it.
    ending: bool = False
    last_token_s: float | None = None

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
    ) -> FinalEvent:
        usage = Usage(
            prompt_tokens=self.num_prompt_tokens, completion_tokens=len(self.token_ids) + num_more
        )
        vector = None if embedding is None else tuple(embedding)
        return FinalEvent(finish_reason=reason, usage=usage, error=error, embedding=vector)
