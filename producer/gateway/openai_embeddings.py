"""OpenAI-compatible ``POST /v1/embeddings``: one queued embed request per input text.

Each text becomes a request of its own (task ``embed``), queued with a priority
like any other and run by a worker as prefill-only work; the answer is every
input's vector, in order, once all have ended.
"""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request, Response

from producer.gateway.auth import Caller
from producer.gateway.backend import Backend, BackendDep, Submitted
from producer.gateway.errors import error_responses, invalid
from producer.gateway.openai_routes import (
    CLIENT_CLOSED,
    REQUEST_ID_HEADER,
    cancel_all,
    origin,
    submit_all,
)
from producer.gateway.sse import unless_disconnected
from producer.openai.embeddings import (
    EmbeddingList,
    EmbeddingRequest,
    embed_requests,
    embedding_list,
)
from producer.openai.output import failure
from shared.errors import NotFound
from shared.models import FinalEvent

router = APIRouter(prefix="/v1", tags=["openai"])
API = "embeddings"


@router.post(
    "/embeddings",
    response_model=EmbeddingList,
    responses=error_responses(400, 401, 403, 404, 409, 429, 500, 503, 504),
)
async def embeddings(
    body: EmbeddingRequest, request: Request, caller: Caller, backend: BackendDep
) -> Response:
    """Embed a text or a list of texts (OpenAI-compatible; L2-normalised vectors)."""
    gens = embed_requests(body, origin(caller, body.priority))
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
        if (error := failure(final, "embeddings")) is not None:
            raise error
    answer = embedding_list(body, finals)
    body_bytes = orjson.dumps(answer.model_dump(mode="json"))
    return Response(body_bytes, media_type="application/json", headers=headers)


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
