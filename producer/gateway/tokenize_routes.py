"""vLLM's ``/tokenize`` and ``/detokenize``, answered by a worker's tokenizer through
the queue (``producer.gateway.tokenizer_calls``). Chat messages are rendered as the
chat route renders them (its own request mapping), so a count here equals that
route's ``usage.prompt_tokens`` for the same messages."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import APIRouter, Request
from pydantic import ValidationError

from producer.gateway.auth import Caller, Principal
from producer.gateway.backend import Backend, BackendDep
from producer.gateway.errors import error_responses, invalid
from producer.gateway.openai_routes import chat_features, origin
from producer.gateway.tokenizer_calls import ask_tokenizer, max_model_len, tokenizer_request
from producer.openai.errors import from_validation_errors
from producer.openai.requests import Origin, chat_request
from producer.openai.schemas import ChatCompletionRequest
from producer.openai.tokenization import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from shared.models import GenerationRequest

router = APIRouter(tags=["tokenizer"])
# The native fields a worker's refusal may name, as a chat body calls them.
CHAT_NAMES = {"prompt": "messages", "prompt_token_ids": "messages"}
ERRORS = error_responses(400, 401, 403, 404, 429, 500, 503)


@router.post("/tokenize", response_model=TokenizeResponse, responses=ERRORS)
async def tokenize(
    body: TokenizeRequest, request: Request, caller: Caller, backend: BackendDep
) -> TokenizeResponse:
    """A prompt, or chat messages through the model's chat template, as token ids."""
    model = body.model or backend.settings.default_model
    gen = await _tokenize_gen(body, model, caller, backend)
    names = {"prompt_token_ids": "prompt"} if body.messages is None else CHAT_NAMES
    final = await ask_tokenizer(backend, caller, gen, request, "tokenize", names)
    tokens = list(final.prompt_token_ids or ())
    context = await max_model_len(backend, gen.model)
    return TokenizeResponse(count=len(tokens), max_model_len=context or 0, tokens=tokens)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERRORS)
async def detokenize(
    body: DetokenizeRequest, request: Request, caller: Caller, backend: BackendDep
) -> DetokenizeResponse:
    """Token ids as text (special tokens included)."""
    if not body.tokens:
        raise invalid("tokens: give at least one token id", "tokens")
    where = origin(caller, body.priority)
    inputs = {"prompt_token_ids": body.tokens, "task": "detokenize"}
    gen = _built(body.model or backend.settings.default_model, where, inputs)
    gen = tokenizer_request(gen, "detokenize", caller, body.priority is not None)
    names = {"prompt_token_ids": "tokens"}
    final = await ask_tokenizer(backend, caller, gen, request, "detokenize", names)
    return DetokenizeResponse(prompt=final.detokenized or "")


async def _tokenize_gen(
    body: TokenizeRequest, model: str, caller: Principal, backend: Backend
) -> GenerationRequest:
    _check(body)
    where = origin(caller, body.priority)
    if body.messages is None:
        special = body.add_special_tokens is not False
        gen = _built(
            model, where, {"prompt": body.prompt, "add_special_tokens": special, "task": "tokenize"}
        )
    else:
        chat = ChatCompletionRequest(
            model=model,
            messages=body.messages,
            tools=body.tools,
            chat_template_kwargs=body.chat_template_kwargs,
        )
        gen = chat_request(chat, where, await chat_features(backend, model)).requests[0]
    return tokenizer_request(gen, "tokenize", caller, body.priority is not None)


def _check(body: TokenizeRequest) -> None:
    if (body.prompt is None) == (body.messages is None):
        raise invalid("give exactly one of prompt and messages", "prompt")
    if body.return_token_strs:
        raise invalid("return_token_strs is not supported", "return_token_strs", "unsupported")
    if body.messages is None:
        if body.tools or body.chat_template_kwargs:
            raise invalid("tools and chat_template_kwargs go with messages", "tools")
        return
    # The chat route renders messages so; other renderings would count another prompt.
    for name, value, served in (
        ("add_generation_prompt", body.add_generation_prompt, True),
        ("continue_final_message", body.continue_final_message, False),
        ("add_special_tokens", bool(body.add_special_tokens), False),
    ):
        if value != served:
            message = f"{name}: only {str(served).lower()} is supported with messages"
            raise invalid(message, name, "unsupported")


def _built(model: str, where: Origin, inputs: Mapping[str, object]) -> GenerationRequest:
    data = {"model": model, **inputs, "priority": where.priority}
    try:
        return GenerationRequest.model_validate(data)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from e
