"""What a model's workers can take, as they register it: the vocabulary, the context a
request may fill, the embedding size, whether they serve structured outputs. Workers
write theirs on the model's slot on every heartbeat (``register_limits``); a submit
reads them (``registered_limits``) and refuses up front what no worker would run
(``check_limits``, on every submit path: the clients, the gateway, batches), with a
typed ``RequestRefused`` naming the field and the limit. The worker checks again, and
ends such a request with the same refusal, so a limit missed here is never a crash.

A text prompt is tokenized by the worker alone; a submit bounds its tokens from below
by its bytes (no token stands for more than ``max_bytes_per_token`` of them), so a text
that could never fit is refused at once and one that might is left to the worker."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.errors import MissingCapability
from shared.keys import Keys, model_tag
from shared.models import GenerationRequest
from shared.refusal import RefusalCode, RequestRefused, invalid
from shared.replies import text

# How long a client keeps the limits it read before reading them again.
LIMITS_CACHE_S = 5.0


class ModelLimits(BaseModel):
    """One worker's limits (or the laxest of several: ``merged``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    vocab_size: int = Field(ge=1)
    max_model_len: int = Field(ge=1, description="prompt plus generated tokens of a request")
    embedding_size: int | None = Field(None, ge=1, description="None: it computes none")
    generates: bool = Field(True, description="it generates (a pooling worker embeds only)")
    guided: bool = Field(True, description="it serves structured outputs (guided_*)")
    prompt_scores: bool = Field(True, description="it scores prompts (prompt_logprobs)")
    max_bytes_per_token: int | None = Field(
        None, ge=1, description="the most UTF-8 bytes one token of its vocabulary spells"
    )

    def check(self, req: GenerationRequest) -> None:
        """Raise RequestRefused naming the first field over these limits."""
        problem = _problem(self, req)
        if problem is not None:
            code, param, detail = problem
            raise RequestRefused(code, param, f"invalid request for model {req.model!r}: {detail}")
        if req.task in ("generate", "embed"):
            self._check_task(req)
        if req.sampling.guided and not self.guided:
            raise MissingCapability(req.model, "structured outputs")
        if req.sampling.prompt_logprobs is not None and not self.prompt_scores:
            raise invalid(
                "prompt_logprobs",
                f"prompt_logprobs: no worker of model {req.model!r} scores prompts (its "
                "workers run vLLM's engine); leave prompt_logprobs and echo out",
            )

    def _check_task(self, req: GenerationRequest) -> None:
        """Refuse a task no worker of the model runs: embeddings where none computes
        them (vLLM generating workers), tokens where all pool (vLLM pooling workers)."""
        if req.task == "embed" and self.embedding_size is None:
            raise invalid(
                "task",
                f"task: no worker of model {req.model!r} computes embeddings (its workers "
                "run vLLM's engine to generate); embed with a model served by a pooling "
                "worker (--runner pooling) or the built-in engine",
            )
        if req.task == "generate" and not self.generates:
            raise invalid(
                "task",
                f"task: the workers of model {req.model!r} compute embeddings only (vLLM's "
                "pooling runner); send generation to a generating model",
            )


def check_limits(limits: ModelLimits | None, requests: Iterable[GenerationRequest]) -> None:
    """The one check every submit path runs before it queues anything: RequestRefused
    (or MissingCapability) for the first request over its model's registered limits
    (None: none registered, nothing to check)."""
    if limits is None:
        return
    for req in requests:
        limits.check(req)


def merged(limits: Iterable[ModelLimits]) -> ModelLimits | None:
    """The laxest of several workers' limits: what some worker of the model may run."""
    every = list(limits)
    if not every:
        return None
    sizes = [x.embedding_size for x in every if x.embedding_size is not None]
    spelled = [x.max_bytes_per_token for x in every if x.max_bytes_per_token is not None]
    return ModelLimits(
        vocab_size=max(x.vocab_size for x in every),
        max_model_len=max(x.max_model_len for x in every),
        embedding_size=max(sizes) if sizes else None,
        generates=any(x.generates for x in every),
        guided=any(x.guided for x in every),
        prompt_scores=any(x.prompt_scores for x in every),
        # A worker that did not say may take any text: then no text is bounded.
        max_bytes_per_token=max(spelled) if len(spelled) == len(every) else None,
    )


def register_limits(pipe: Any, keys: Keys, model: str, worker_id: str, limits: str) -> None:
    """Queue the write of one worker's limits (``ModelLimits`` JSON); they live as long
    as the model's served marker."""
    pipe.hset(keys.limits(model_tag(model)), worker_id, limits)


def withdraw_limits(pipe: Any, keys: Keys, model: str, worker_id: str) -> None:
    pipe.hdel(keys.limits(model_tag(model)), worker_id)


def registered_limits(
    connection: redis.Redis, model: str, keys: Keys | None = None
) -> ModelLimits | None:
    """The laxest limits the model's workers registered; None when none did (an
    unserved model, or workers from before limits were registered)."""
    keys = keys or Keys()
    raw: dict[Any, Any] = connection.hgetall(keys.limits(model_tag(model)))
    return merged(_parsed(raw.values()))


def _parsed(values: Iterable[Any]) -> list[ModelLimits]:
    out = []
    for value in values:
        try:
            out.append(ModelLimits.model_validate_json(text(value)))
        except ValidationError:
            continue  # written by a newer or older worker: that worker re-checks
    return out


class _Cache:
    """The limits a client read, each kept ``ttl_s``."""

    def __init__(self, keys: Keys, ttl_s: float) -> None:
        self.keys = keys
        self.ttl_s = ttl_s
        self._read: dict[str, tuple[float, ModelLimits | None]] = {}

    def _fresh(self, model: str) -> tuple[bool, ModelLimits | None]:
        read = self._read.get(model)
        if read is None or time.monotonic() - read[0] > self.ttl_s:
            return False, None
        return True, read[1]

    def _keep(self, model: str, limits: ModelLimits | None) -> ModelLimits | None:
        self._read[model] = (time.monotonic(), limits)
        return limits


class LimitsCache(_Cache):
    """A client's view of the registered limits, read at most every ``ttl_s`` a model."""

    def __init__(self, connection: redis.Redis, keys: Keys, ttl_s: float = LIMITS_CACHE_S) -> None:
        super().__init__(keys, ttl_s)
        self.connection = connection

    def check(self, requests: Iterable[GenerationRequest]) -> None:
        """Raise RequestRefused for the first request over its model's limits."""
        for req in requests:
            check_limits(self.get(req.model), [req])

    def get(self, model: str) -> ModelLimits | None:
        fresh, limits = self._fresh(model)
        if fresh:
            return limits
        return self._keep(model, registered_limits(self.connection, model, self.keys))


class AsyncLimitsCache(_Cache):
    """``LimitsCache`` for an asyncio client."""

    def __init__(self, connection: Any, keys: Keys, ttl_s: float = LIMITS_CACHE_S) -> None:
        super().__init__(keys, ttl_s)
        self.connection = connection

    async def check(self, requests: Iterable[GenerationRequest]) -> None:
        for req in requests:
            check_limits(await self.get(req.model), [req])

    async def get(self, model: str) -> ModelLimits | None:
        fresh, limits = self._fresh(model)
        if fresh:
            return limits
        raw: dict[Any, Any] = await self.connection.hgetall(self.keys.limits(model_tag(model)))
        return self._keep(model, merged(_parsed(raw.values())))


# What is over the limits: its kind, the native field at fault, and what to do.
Problem = tuple[RefusalCode, str, str]


def _problem(limits: ModelLimits, req: GenerationRequest) -> Problem | None:
    """What in ``req`` is over ``limits``, naming the field and the limit."""
    s, vocab = req.sampling, limits.vocab_size
    for field, ids in (
        ("prompt_token_ids", req.prompt_token_ids or ()),
        ("sampling.stop_token_ids", s.stop_token_ids),
        ("sampling.logit_bias", tuple(s.logit_bias)),
    ):
        beyond = next((t for t in ids if t >= vocab), None)
        if beyond is not None:
            return (
                RefusalCode.INVALID_VALUE,
                field.removeprefix("sampling."),
                f"{field}: token id {beyond} is outside the model's vocabulary of {vocab} "
                f"tokens (ids 0..{vocab - 1})",
            )
    if req.task == "embed":
        return _embed_problem(limits, req)
    if req.task in ("tokenize", "detokenize"):
        return None  # the model does not run: its context does not bound them
    return _context_problem(limits, req)


def _context_problem(limits: ModelLimits, req: GenerationRequest) -> Problem | None:
    context, max_tokens = limits.max_model_len, req.sampling.max_tokens
    if max_tokens >= context:
        return (
            RefusalCode.CONTEXT_LENGTH_EXCEEDED,
            "max_tokens",
            f"sampling.max_tokens: {max_tokens} is past the model's context of {context} "
            f"tokens (prompt and output together); ask for at most {context - 1}",
        )
    field, num_prompt = _num_prompt_tokens(limits, req)
    if num_prompt and num_prompt + max_tokens > context:
        at_least = "" if field == "prompt_token_ids" else "at least "
        return (
            RefusalCode.CONTEXT_LENGTH_EXCEEDED,
            field,
            f"{field}: {at_least}{num_prompt} prompt tokens and max_tokens {max_tokens} "
            f"need {num_prompt + max_tokens} tokens, over the model's context of {context}",
        )
    return None


def _num_prompt_tokens(limits: ModelLimits, req: GenerationRequest) -> tuple[str, int]:
    """The prompt's field and its tokens: a text's fewest (by its bytes), 0 if unknown."""
    if req.prompt_token_ids is not None:
        return "prompt_token_ids", len(req.prompt_token_ids)
    if limits.max_bytes_per_token is None:
        return "prompt", 0
    if req.messages is not None:
        # An assistant turn's text may be left out by a chat template (earlier reasoning).
        texts = [m.content for m in req.messages if m.role != "assistant"]
        return "messages", _fewest_tokens(texts, limits.max_bytes_per_token)
    return "prompt", _fewest_tokens([req.prompt or ""], limits.max_bytes_per_token)


def _fewest_tokens(texts: Iterable[str], max_bytes_per_token: int) -> int:
    """The fewest tokens ``texts`` can be: their bytes but whitespace (a tokenizer may
    strip or merge it), no token spelling more than ``max_bytes_per_token``."""
    num_bytes = sum(len("".join(text.split()).encode()) for text in texts)
    return math.ceil(num_bytes / max_bytes_per_token)


def _embed_problem(limits: ModelLimits, req: GenerationRequest) -> Problem | None:
    size = limits.embedding_size
    if size is not None and req.dimensions is not None and req.dimensions > size:
        return (
            RefusalCode.INVALID_VALUE,
            "dimensions",
            f"dimensions: {req.dimensions} is more than the model's {size}",
        )
    field, num_prompt = _num_prompt_tokens(limits, req)
    if num_prompt >= limits.max_model_len:
        at_least = "" if field == "prompt_token_ids" else "at least "
        return (
            RefusalCode.CONTEXT_LENGTH_EXCEEDED,
            field,
            f"{field}: {at_least}{num_prompt} tokens to embed, over the model's context of "
            f"{limits.max_model_len}",
        )
    return None
