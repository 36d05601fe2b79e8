"""OpenAI-compatible ``POST /v1/embeddings``: one queued embed request per input text.

Each text becomes a request of its own (task ``embed``), queued with a priority
like any other and run by a worker as prefill-only work; the answer is every
input's vector, in order, once all have ended.
"""

from __future__ import annotations

import base64
import struct
from typing import Literal

import orjson
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field, ValidationError

from producer.gateway.auth import Caller, Principal, priority_for
from producer.gateway.backend import Backend, BackendDep, Submitted
from producer.gateway.errors import error_responses, from_validation_errors, invalid
from producer.gateway.openai_output import failure
from producer.gateway.openai_requests import deadline_ms
from producer.gateway.openai_routes import (
    CLIENT_CLOSED,
    REQUEST_ID_HEADER,
    cancel_all,
    submit_all,
)
from producer.gateway.openai_schemas import QueueFields
from producer.gateway.sse import unless_disconnected
from shared.errors import NotFound
from shared.models import MAX_EMBEDDING_DIMENSIONS, FinalEvent, GenerationRequest

router = APIRouter(prefix="/v1", tags=["openai"])
MAX_INPUTS = 2048  # OpenAI's own limit on inputs per call
API = "embeddings"


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


@router.post(
    "/embeddings",
    response_model=EmbeddingList,
    responses=error_responses(400, 401, 403, 404, 429, 500, 503, 504),
)
async def embeddings(
    body: EmbeddingRequest, request: Request, caller: Caller, backend: BackendDep
) -> Response:
    """Embed a text or a list of texts (OpenAI-compatible; L2-normalised vectors)."""
    gens = embed_requests(body, caller)
    await check_dimensions(backend, body)
    submitted = await submit_all(backend, gens, API, caller)
    headers = {REQUEST_ID_HEADER: ",".join(s.request_id for s in submitted)}
    headers.update(submitted[-1].rate_headers)
    finals = await unless_disconnected(request, _finals(backend, submitted))
    if finals is None:
        backend.metrics.disconnects.labels(API).inc()
        await cancel_all(backend, submitted)
        return Response(status_code=CLIENT_CLOSED)
    for final in finals:
        if (error := failure(final)) is not None:
            raise error
    answer = embedding_list(body, finals)
    body_bytes = orjson.dumps(answer.model_dump(mode="json"))
    return Response(body_bytes, media_type="application/json", headers=headers)


def embed_requests(body: EmbeddingRequest, caller: Principal) -> list[GenerationRequest]:
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
        "priority": priority_for(caller, body.priority),
        "deadline_ms": deadline_ms(body.deadline),
        "metadata": {**extra, "tenant": caller.tenant},
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


async def check_dimensions(backend: Backend, body: EmbeddingRequest) -> None:
    """A 400 for more ``dimensions`` than the model's live workers' embeddings have (a
    model no worker serves now is left to the queue, as any request is)."""
    if body.dimensions is None:
        return
    live = (await backend.registry.live()).get(body.model)
    size = None if live is None else live.embedding_size
    if size is not None and body.dimensions > size:
        message = (
            f"dimensions: {body.dimensions} is more than the {size} of model "
            f"{body.model!r}'s embeddings; ask for {size} or fewer"
        )
        raise invalid(message, "dimensions")


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


async def _finals(backend: Backend, submitted: list[Submitted]) -> list[FinalEvent]:
    return [await _final(backend, s) for s in submitted]


async def _final(backend: Backend, submitted: Submitted) -> FinalEvent:
    async for batch in backend.events(submitted.request_id):
        for entry in batch:
            if entry.is_final:
                final = entry.final()
                if not submitted.duplicate:
                    backend.metrics.finished(
                        submitted.request.model, submitted.request.priority, final
                    )
                return final
    raise NotFound(f"request {submitted.request_id} ended without a final event")
