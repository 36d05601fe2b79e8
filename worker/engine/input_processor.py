"""What an engine can take, decided in one place: a request's validation against the
model and the KV cache, how many more requests to claim, and the limits the worker
registers. The in-process engine and the engine process (``worker.engine_process``)
each hold one, built from the same ``EngineShape``, so a request is refused with the
same refusal before it reaches the engine, whichever runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from shared.limits import ModelLimits
from shared.refusal import invalid, too_long
from worker.engine.config import EngineConfig
from worker.engine.prompt_logprobs import check_prompt_length
from worker.engine.prompt_tokens import max_bytes_per_token
from worker.engine.request import EngineRequest


@dataclass(frozen=True)
class EngineShape:
    """The figures a loaded engine's limits and capacity follow from."""

    vocab_size: int
    max_model_len: int  # what one request may hold: the model's, or the KV pool's if fewer
    model_max_len: int  # the model's own context
    embedding_size: int | None
    kv_cache_budget_bytes: int
    max_num_seqs: int  # the scheduler's (a hybrid's state slots may lower the config's)
    max_num_resumed_seqs: int


@dataclass(frozen=True)
class HeldCounts:
    """What an engine holds now: every request, and those not resumed mid-answer."""

    num_held: int
    num_new: int


class InputProcessor:
    """Validation, capacity and limits of one engine (see the module docs)."""

    def __init__(self, shape: EngineShape, config: EngineConfig, tokenizer: Any) -> None:
        self.shape = shape
        self.config = config
        self.tokenizer = tokenizer

    def validate(self, req: EngineRequest) -> None:
        """Raise ``RequestRefused`` naming the field at fault when ``req`` cannot run
        here; an adapter is the engine's to check (it holds the adapter store)."""
        if not req.prompt_token_ids:
            raise invalid("prompt", "prompt: it has no tokens")
        if req.embed:
            self._validate_embed(req)
            return
        check_prompt_length(req)
        self._check_context(req)
        self._check_vocab(req)

    def _check_context(self, req: EngineRequest) -> None:
        num_prompt_tokens = len(req.prompt_token_ids)
        num_tokens = num_prompt_tokens + len(req.output_token_ids)
        num_needed = num_prompt_tokens + req.sampling.max_tokens
        max_model_len = self.shape.max_model_len
        if num_tokens < max_model_len and num_needed <= max_model_len:
            return
        limit, what = self._context_limit()
        param = "prompt" if num_prompt_tokens >= limit else "max_tokens"
        raise too_long(
            param,
            f"{param}: {num_prompt_tokens} prompt tokens and "
            f"max_tokens {req.sampling.max_tokens} need {num_needed} tokens of context, "
            f"over the {limit} that {what}; shorten the prompt or lower max_tokens",
        )

    def _check_vocab(self, req: EngineRequest) -> None:
        """Every token id the request names is in the vocabulary."""
        sampling, vocab_size = req.sampling, self.shape.vocab_size
        for field, ids in (
            ("logit_bias", sampling.logit_bias),
            ("stop_token_ids", sampling.stop_token_ids),
        ):
            too_big = [t for t in ids if t >= vocab_size]
            if too_big:
                raise invalid(
                    field,
                    f"{field}: token id {too_big[0]} is not in this model's vocabulary of "
                    f"{vocab_size} tokens (ids 0..{vocab_size - 1})",
                )

    def _validate_embed(self, req: EngineRequest) -> None:
        limit, what = self._context_limit()
        if len(req.prompt_token_ids) >= self.shape.max_model_len:
            raise too_long(
                "prompt",
                f"prompt: the text to embed is {len(req.prompt_token_ids)} "
                f"tokens, over the {limit} that {what}; shorten it",
            )
        size = self.shape.embedding_size
        if req.dimensions is not None and size is not None and req.dimensions > size:
            raise invalid(
                "dimensions",
                f"dimensions {req.dimensions} is more than this model's {size}: "
                f"ask for {size} or fewer",
            )

    def _context_limit(self) -> tuple[int, str]:
        """The tokens one request may hold, and what sets that limit."""
        shape = self.shape
        if shape.max_model_len < shape.model_max_len:
            mib = shape.kv_cache_budget_bytes >> 20
            return (
                shape.max_model_len,
                f"this worker's KV cache holds ({mib} MiB; see --kv-cache-mib)",
            )
        return shape.model_max_len, "the model takes (its max_model_len)"

    def num_free_slots(self, held: HeldCounts, resumed: bool = False) -> int:
        """How many more requests to claim now: free batch rows plus a small
        look-ahead, so a more urgent request can wait here and preempt (refilled two at
        a time: ``EngineConfig.num_to_claim``); with ``resumed``, how many requests
        resumed mid-answer (they have rows kept)."""
        shape = self.shape
        if resumed:
            capacity = shape.max_num_seqs + self.config.num_lookahead_slots
            capacity += shape.max_num_resumed_seqs
            return max(0, capacity - held.num_held)
        return self.config.num_to_claim(shape.max_num_seqs, held.num_new)

    def limits(self, guided: bool) -> ModelLimits:
        """What this engine can take, for the worker to register (``shared.limits``)."""
        return ModelLimits(
            vocab_size=self.shape.vocab_size,
            max_model_len=self.shape.max_model_len,
            embedding_size=self.shape.embedding_size,
            guided=guided,
            max_bytes_per_token=self.max_bytes_per_token,
        )

    @cached_property
    def max_bytes_per_token(self) -> int:
        return max_bytes_per_token(self.tokenizer)
