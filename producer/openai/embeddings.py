"""OpenAI embeddings bodies: one embed request per input text, and the vectors back
in OpenAI's list (floats or base64 of little-endian float32)."""

from __future__ import annotations

import base64
import struct
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from producer.openai.errors import from_validation_errors, invalid
from producer.openai.requests import Origin, deadline_ms
from producer.openai.schemas import QueueFields
from shared.models import MAX_EMBEDDING_DIMENSIONS, FinalEvent, GenerationRequest

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per call


class EmbeddingRequest(QueueFields):
    model: str
    input: str | list[str] = Field(description=f"a text, or a list of up to {MAX_INPUTS}")
    dimensions: int | None = Field(
        None,
        description="keep the first dimensions (normalised again); at most the model's",
        json_schema_extra={"minimum": 1, "maximum": MAX_EMBEDDING_DIMENSIONS},
    )
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of float32 (LE)")


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def embed_requests(body: EmbeddingRequest, origin: Origin) -> list[GenerationRequest]:
    """One validated embed request per text, in order; ApiError (400) naming the field."""
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not 1 <= len(texts) <= MAX_INPUTS:
        raise invalid(f"input: give 1 to {MAX_INPUTS} texts (got {len(texts)})", "input")
    blank = [i for i, text in enumerate(texts) if not text.strip()]
    if blank:
        raise invalid(f"input[{blank[0]}]: a text to embed must not be blank", "input")
    extra = {"user": body.user} if body.user else {}
    common = {
        "model": body.model,
        "task": "embed",
        "dimensions": body.dimensions,
        "priority": origin.priority,
        "deadline_ms": deadline_ms(body.deadline),
        "metadata": extra,
    }
    key = body.idempotency_key
    try:
        return [
            GenerationRequest.model_validate(
                {**common, "prompt": text, "idempotency_key": _nth_key(key, i, len(texts))}
            )
            for i, text in enumerate(texts)
        ]
    except ValidationError as e:
        raise from_validation_errors(_as_input(e)) from e


def embedding_list(body: EmbeddingRequest, finals: list[FinalEvent]) -> EmbeddingList:
    data = [
        Embedding(index=i, embedding=_encoded(final, body.encoding_format))
        for i, final in enumerate(finals)
    ]
    num_tokens = sum(final.usage.prompt_tokens for final in finals)
    usage = EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens)
    return EmbeddingList(data=data, model=body.model, usage=usage)


def _encoded(final: FinalEvent, encoding_format: str) -> list[float] | str:
    vector = list(final.embedding or ())
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def _nth_key(key: str | None, index: int, num_inputs: int) -> str | None:
    return key if key is None or num_inputs == 1 else f"{key}#{index}"


def _as_input(error: ValidationError) -> list[dict[str, object]]:
    """The request's errors under the OpenAI names: the text is ``input``."""
    errors: list[dict[str, object]] = []
    for item in error.errors():
        loc = ["input" if part == "prompt" else part for part in item["loc"]]
        errors.append({**item, "loc": tuple(loc)})
    return errors
