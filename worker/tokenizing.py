"""Requests for the tokenizer alone (``task`` tokenize and detokenize): answered at
admission, without the model, through the same encoding a generate request's prompt
takes (``worker.admission.prompt_token_ids``), so a count equals the prompt tokens the
same request would use."""

from __future__ import annotations

from typing import Protocol

from shared.models import FinalEvent, FinishReason, GenerationRequest, Usage
from worker.admission import Encoder, checked_token_ids, prompt_token_ids

TOKENIZER_TASKS = frozenset({"tokenize", "detokenize"})


class Tokenizer(Encoder, Protocol):
    """What the answers need of an engine: its encoding, and its decoding."""

    def encode_text(self, text: str, add_special_tokens: bool) -> list[int]: ...
    def decode_tokens(self, token_ids: list[int]) -> str: ...


def tokenizer_answer(tokenizer: Tokenizer, req: GenerationRequest) -> FinalEvent:
    """The final event that answers a tokenize or detokenize request; ValueError (the
    request's fault, naming the field) for ids outside the vocabulary or messages the
    chat template refuses. Usage stays zero: the model did not run."""
    if req.task == "detokenize":
        ids = checked_token_ids(req.prompt_token_ids or (), tokenizer.vocab_size)
        text = tokenizer.decode_tokens(ids)
        return FinalEvent(finish_reason=FinishReason.STOP, usage=Usage(), detokenized=text)
    if req.prompt is not None and not req.add_special_tokens:
        ids = tokenizer.encode_text(req.prompt, add_special_tokens=False)
    else:
        ids = prompt_token_ids(tokenizer, req)
    return FinalEvent(finish_reason=FinishReason.STOP, usage=Usage(), prompt_token_ids=tuple(ids))
