"""What a model's workers can take, as they register it: the vocabulary, the context a
request may fill, the embedding size, whether they serve structured outputs. Workers
write theirs on the model's slot on every heartbeat (``register_limits``); a submit
reads them (``registered_limits``) and refuses up front what no worker would run
(``check_limits``), naming the field and the limit. The worker checks again, and ends
such a request with the same kind of error, so a limit missed here is never a crash."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.errors import InvalidRequest, MissingCapability
from shared.keys import Keys, model_tag
from shared.models import GenerationRequest
from shared.replies import text

# How long a client keeps the limits it read before reading them again.
LIMITS_CACHE_S = 5.0


class ModelLimits(BaseModel):
    """One worker's limits (or the laxest of several: ``merged``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    vocab_size: int = Field(ge=1)
    max_model_len: int = Field(ge=1, description="prompt plus generated tokens of a request")
    embedding_size: int | None = Field(None, ge=1)
    guided: bool = Field(True, description="it serves structured outputs (guided_*)")

    def check(self, req: GenerationRequest) -> None:
        """Raise InvalidRequest naming the first field over these limits."""
        problem = _problem(self, req)
        if problem is not None:
            raise InvalidRequest(f"invalid request for model {req.model!r}: {problem}")
        if req.sampling.guided and not self.guided:
            raise MissingCapability(req.model, "structured outputs")


def merged(limits: Iterable[ModelLimits]) -> ModelLimits | None:
    """The laxest of several workers' limits: what some worker of the model may run."""
    every = list(limits)
    if not every:
        return None
    sizes = [x.embedding_size for x in every if x.embedding_size is not None]
    return ModelLimits(
        vocab_size=max(x.vocab_size for x in every),
        max_model_len=max(x.max_model_len for x in every),
        embedding_size=max(sizes) if sizes else None,
        guided=any(x.guided for x in every),
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
        """Raise InvalidRequest for the first request over its model's limits."""
        for req in requests:
            limits = self.get(req.model)
            if limits is not None:
                limits.check(req)

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
            limits = await self.get(req.model)
            if limits is not None:
                limits.check(req)

    async def get(self, model: str) -> ModelLimits | None:
        fresh, limits = self._fresh(model)
        if fresh:
            return limits
        raw: dict[Any, Any] = await self.connection.hgetall(self.keys.limits(model_tag(model)))
        return self._keep(model, merged(_parsed(raw.values())))


def _problem(limits: ModelLimits, req: GenerationRequest) -> str | None:
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
                f"{field}: token id {beyond} is outside the model's vocabulary of {vocab} "
                f"tokens (ids 0..{vocab - 1})"
            )
    if req.task == "embed":
        return _embed_problem(limits, req)
    if req.task in ("tokenize", "detokenize"):
        return None  # the model does not run: its context does not bound them
    context = limits.max_model_len
    if s.max_tokens >= context:
        return (
            f"sampling.max_tokens: {s.max_tokens} is past the model's context of {context} "
            f"tokens (prompt and output together); ask for at most {context - 1}"
        )
    num_prompt = len(req.prompt_token_ids or ())
    if num_prompt and num_prompt + s.max_tokens > context:
        return (
            f"prompt_token_ids: {num_prompt} prompt tokens and max_tokens {s.max_tokens} "
            f"need {num_prompt + s.max_tokens} tokens, over the model's context of {context}"
        )
    return None


def _embed_problem(limits: ModelLimits, req: GenerationRequest) -> str | None:
    size = limits.embedding_size
    if size is not None and req.dimensions is not None and req.dimensions > size:
        return f"dimensions: {req.dimensions} is more than the model's {size}"
    num_prompt = len(req.prompt_token_ids or ())
    if num_prompt >= limits.max_model_len:
        return (
            f"prompt_token_ids: {num_prompt} tokens to embed, over the model's context of "
            f"{limits.max_model_len}"
        )
    return None
