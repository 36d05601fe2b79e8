"""Questions for a model's tokenizer (``task`` tokenize or detokenize), asked through
the queue: the producer side has no tokenizer (the worker's is the one whose counts
are true), so a worker answers them at admission, without running the model.

They run at high priority (within the caller's key) so that a count does not wait
behind generation, and with one token of output budget, so that enqueue's fair-share
and rate-limit estimates charge them for their prompt alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError
from starlette.requests import Request

from producer.gateway.auth import Principal
from producer.gateway.backend import Backend
from producer.gateway.errors import ApiError
from producer.gateway.sse import unless_disconnected
from producer.openai.errors import from_validation_errors
from producer.openai.output import failure
from shared.limits import AsyncLimitsCache
from shared.models import FinalEvent, GenerationRequest, Task
from shared.priority import Priority

CLIENT_CLOSED = 499  # nginx's code: the client left before the answer


def tokenizer_request(gen: GenerationRequest, task: Task, caller: Principal,
                      asked_priority: bool) -> GenerationRequest:  # fmt: skip
    """``gen`` (as a route built it to generate) asked of the tokenizer instead."""
    priority = gen.priority if asked_priority else min(int(Priority.HIGH), caller.max_priority)
    data = {**gen.model_dump(exclude={"sampling", "idempotency_key"}), "task": task}
    data.update(priority=priority, sampling={"max_tokens": 1})
    try:
        return GenerationRequest.model_validate(data)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from e


async def ask_tokenizer(
    backend: Backend,
    caller: Principal,
    gen: GenerationRequest,
    request: Request,
    api: str,
    names: Mapping[str, str],
) -> FinalEvent:
    """Submit ``gen`` (a tokenize or detokenize request; ``api`` labels its metrics) and
    wait for its answer; a 400 for what the worker refused, its field named by
    ``names`` (native name to the route's). A client that leaves first has its request
    cancelled."""
    gen = await backend.with_adapter(gen)
    # An adapter shares its base's tokenizer: any worker of the base answers.
    gen = gen.model_copy(update={"lora": None})
    try:
        submitted = await backend.submit(gen, api=api, caller=caller)
    except ApiError as e:  # refused at submit by the model's limits: the route's names
        _renamed(e, names)
        raise
    final = await unless_disconnected(request, backend.final(submitted.request_id))
    if final is None:
        await backend.cancel(submitted.request_id)
        raise ApiError(CLIENT_CLOSED, "the client closed the request", code="client_closed")
    error = failure(final, api)
    if error is not None:
        raise _renamed(error, names)
    return final


def _renamed(error: ApiError, names: Mapping[str, str]) -> ApiError:
    """``error`` with its field named as the route names it."""
    error.detail.param = names.get(error.detail.param or "", error.detail.param)
    return error


async def max_model_len(backend: Backend, model: str) -> int | None:
    """The context its workers registered (the laxest of them); None if none did."""
    limits = await AsyncLimitsCache(backend.redis, backend.keys).get(model)
    return None if limits is None else limits.max_model_len
