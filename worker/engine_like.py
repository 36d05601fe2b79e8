"""What the worker loop needs of an engine: the real one or the simulation."""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Protocol

from shared.models import FinishReason
from shared.refusal import Refusal, RefusalCode, RequestRefused
from worker.engine.outputs import RequestOutput
from worker.engine.request import EngineRequest

log = logging.getLogger(__name__)


class EngineGone(RuntimeError):
    """The engine itself is gone (its process died): no request's fault. Admission lets
    it through, and the worker stops; the leases it held lapse and other workers
    resume its requests."""


class AdmissionError(NamedTuple):
    """What a request the engine would not take ends with: its error text, and its
    refusal when it was the request's own fault."""

    error: str
    refusal: Refusal | None


def admission_error(request_id: str, e: Exception) -> AdmissionError:
    """What a request ends with when the engine would not take it (logged here): its
    own fault (``RequestRefused`` from the engine, its chat template, its grammar or
    the adapter registry; any other ValueError names no field), or the worker's
    failure on it."""
    if isinstance(e, ValueError):
        log.warning("request %s cannot run: %r", request_id, e)
        if isinstance(e, RequestRefused):
            return AdmissionError(e.refusal.error_text, e.refusal)
        refusal = Refusal(code=RefusalCode.INVALID_VALUE, param=None, message=str(e))
        return AdmissionError(refusal.error_text, refusal)
    log.warning("request %s failed at admission: %r", request_id, e)
    return AdmissionError(f"internal error: at admission: {e!r}", None)


class EngineLike(Protocol):
    """What the loop needs of an engine: the real one or the simulation."""

    @property
    def vocab_size(self) -> int: ...
    def encode_prompt(self, prompt: str) -> list[int]: ...
    def encode_text(self, text: str, add_special_tokens: bool) -> list[int]: ...
    def decode_tokens(self, token_ids: list[int]) -> str: ...
    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = ...,
        template_kwargs: dict[str, Any] | None = ...,
    ) -> list[int]: ...
    def add_request(self, req: EngineRequest) -> None: ...
    def abort_request(self, request_id: str, reason: FinishReason = ...) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished_requests(self) -> bool: ...
    def num_free_slots(self, resumed: bool = False) -> int: ...
    def stats(self) -> dict[str, float]: ...
    def resident_loras(self) -> list[str]: ...
    def lora_rank_limit(self) -> int: ...
    def warm_fingerprints(self, limit: int) -> list[str]: ...
