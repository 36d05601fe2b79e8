"""A tokenq request as vLLM's, and vLLM's logprobs as tokenq's: plain data, no vLLM
import.

What maps: the token budget (``max_tokens`` / ``min_tokens``, less the tokens a resumed
request keeps), temperature, top_p, top_k, min_p, the penalties, ``logit_bias``,
``seed``, stop token ids, ``ignore_eos`` and ``logprobs``; priority with its sign turned
(vLLM runs the lowest value first, tokenq the highest); structured outputs
(``guided_json`` / ``guided_regex`` / ``guided_structural_tag``, checked by the producer
as for the built-in engine) as vLLM's ``StructuredOutputsParams``; a LoRA adapter from
tokenq's registry as vLLM's ``LoRARequest`` (:class:`LoraIds` numbers them). Stop
strings are matched on tokenq's side over vLLM's tokens
(``worker.engine.token_output``), so that a request resumed on another worker matches
across what it kept, and ends with the same text and ``stop_sequence`` on either engine.
An embed request goes to a pooling worker (``--runner pooling``) as vLLM's
``PoolingParams(task="embed")``; its L2-normalised vector comes back as tokenq's,
``dimensions`` kept as the built-in engine keeps them (:func:`embedding_of`). A pooling
worker computes no tokens, a generating one no embeddings: each refuses the other's
requests by name. What does not map is refused by name (:func:`refuse_unmapped`), never
dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import orjson

from shared.models import GUIDES, FinishReason, SamplingParams
from shared.refusal import invalid, too_long
from worker.engine.request import EngineRequest, LoraRef

# tokenq's guided fields (``shared.models.GUIDES``) as vLLM's ``StructuredOutputsParams``
# fields: the same names without ``guided_`` (json, regex, structural_tag).
STRUCTURED_OUTPUTS = {name: name.removeprefix("guided_") for name in GUIDES}

# Why a vLLM engine with LoRA on scores no prompt: vLLM 0.32's LoRA logits processor takes
# one row per request, and prompt logprobs bring one per prompt token: its engine core
# dies (vLLM issues 29955 and 16668).
LORA_SCORES = "vLLM cannot score prompts while it serves LoRA adapters"

# vLLM's finish reasons (``CompletionOutput.finish_reason``) as tokenq's.
FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.CANCELLED,
    "error": FinishReason.ERROR,
}


class Logprob(Protocol):
    """vLLM's ``Logprob``, as read here."""

    @property
    def logprob(self) -> float: ...
    @property
    def rank(self) -> int | None: ...


# Why a request of the other kind is refused (``param: task``).
GENERATES_ONLY = (
    "task: this vLLM worker generates and computes no embeddings; embed on a worker "
    "started with --runner pooling (or the built-in engine)"
)
POOLS_ONLY = (
    "task: this vLLM worker computes embeddings only (started with --runner pooling); "
    "send generation to a worker of a generating model"
)


def refuse_unmapped(req: EngineRequest, serves_lora: bool, pools: bool = False) -> None:
    """RequestRefused naming the first feature of ``req`` this engine does not serve
    (``serves_lora``: it was started with LoRA on; ``pools``: it runs vLLM's pooling
    runner, embeddings only)."""
    sampling = req.sampling
    if req.embed != pools:
        raise invalid("task", POOLS_ONLY if pools else GENERATES_ONLY)
    if req.lora is not None and not serves_lora:
        raise invalid(
            "lora", "lora: this vLLM worker serves no LoRA adapters (start it with --enable-lora)"
        )
    if sampling.prompt_logprobs is not None and serves_lora:
        raise invalid(
            "prompt_logprobs",
            f"prompt_logprobs: {LORA_SCORES}; ask a worker started without --enable-lora",
        )
    guide = guide_name(sampling)
    if guide is not None and req.output_token_ids:
        # vLLM's grammar follows the tokens it generates; kept tokens reach it as prompt.
        raise invalid(
            guide,
            f"{guide}: a structured request resumed after its worker died cannot continue on "
            "the vLLM engine (its grammar cannot start after the tokens kept); submit it again",
        )


def check_embed(req: EngineRequest, max_model_len: int, embedding_size: int | None) -> None:
    """The built-in engine's bounds on an embed request (``worker.engine.input_processor``):
    a prompt within the context, no more ``dimensions`` than the model's."""
    num_prompt = len(req.prompt_token_ids)
    if num_prompt >= max_model_len:
        raise too_long(
            "prompt",
            f"prompt: the text to embed is {num_prompt} tokens, over the {max_model_len} "
            "this vLLM worker takes; shorten it",
        )
    if (
        req.dimensions is not None
        and embedding_size is not None
        and req.dimensions > embedding_size
    ):
        raise invalid(
            "dimensions",
            f"dimensions {req.dimensions} is more than this model's {embedding_size}: "
            f"ask for {embedding_size} or fewer",
        )


def embedding_of(vector: Sequence[float], dimensions: int | None) -> list[float]:
    """tokenq's embedding from vLLM's pooled vector: its first ``dimensions`` values (all
    with None), L2-normalised, as the built-in engine's (``worker.engine.pooling``)."""
    kept = [float(v) for v in vector[:dimensions]]
    norm = math.sqrt(math.fsum(v * v for v in kept))
    return [v / norm for v in kept] if norm > 0 else kept


def guide_name(sampling: SamplingParams) -> str | None:
    """The guided field ``sampling`` sets, if any."""
    return next((name for name in STRUCTURED_OUTPUTS if getattr(sampling, name) is not None), None)


def structured_outputs(sampling: SamplingParams) -> dict[str, str] | None:
    """vLLM ``StructuredOutputsParams`` keyword arguments for a guided request, None for
    any other. Schemas go as JSON text, properties in the order the schema declares them
    (as the built-in engine compiles them; an empty schema stays a schema)."""
    name = guide_name(sampling)
    if name is None:
        return None
    value = getattr(sampling, name)
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return {STRUCTURED_OUTPUTS[name]: text}


class LoraIds:
    """vLLM's integer id of each adapter (from 1, as vLLM wants), one per name and path:
    an adapter registered again at another path is another adapter to vLLM."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], int] = {}

    def id_of(self, lora: LoraRef) -> int:
        return self._ids.setdefault((lora.name, lora.path), len(self._ids) + 1)


def sampling_kwargs(req: EngineRequest) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments for ``req`` (it has passed
    :func:`refuse_unmapped`); a resumed request's budget counts what it kept."""
    s = req.sampling
    num_kept = len(req.output_token_ids)
    return {
        # max_tokens 0 scores the prompt alone: vLLM makes one token, which is dropped.
        "max_tokens": max(1, s.max_tokens - num_kept),
        "min_tokens": max(0, s.min_tokens - num_kept),
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "repetition_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "logit_bias": {int(k): v for k, v in s.logit_bias.items()} or None,
        "seed": s.seed,
        "stop_token_ids": list(s.stop_token_ids),
        "ignore_eos": s.ignore_eos,
        "logprobs": s.logprobs,
        "prompt_logprobs": s.prompt_logprobs,
        "detokenize": False,  # tokenq's own detokenizer and stop strings (module docs)
    }


def vllm_priority(priority: int) -> int:
    """tokenq's priority as vLLM's: vLLM schedules (and keeps from preemption) the
    lowest value first, tokenq the highest."""
    return -priority


def logprob_entry(token_id: int, entry: Mapping[int, Logprob], num_top: int) -> dict[str, Any]:
    """One token's vLLM logprobs as tokenq's entry: the chosen token's logprob and its
    ``num_top`` best alternatives in rank order (named later, as the built-in's are)."""
    ranked = sorted(
        ((lp.rank, tid, lp.logprob) for tid, lp in entry.items() if lp.rank is not None),
        key=lambda item: item[0],
    )
    top = [{"token_id": tid, "logprob": value} for _, tid, value in ranked[:num_top]]
    return {"token_id": token_id, "logprob": entry[token_id].logprob, "top": top}


def prompt_logprob_entries(
    prompt_token_ids: Sequence[int],
    scores: Sequence[Mapping[int, Logprob] | None],
    num_top: int,
    names: Mapping[int, tuple[str, list[int] | None]],
) -> list[dict[str, Any]]:
    """vLLM's prompt logprobs as tokenq's entries, one per token of ``prompt_token_ids``
    (the first's logprob None), each with its rank and ``num_top`` alternatives, named
    (``names``: ``worker.engine.detokenizer.TokenNames``) as the built-in's are. vLLM
    scored the prompt and any tokens a resumed request kept: those are left out."""
    num_prompt = len(prompt_token_ids)
    given = [scored for scored in scores[1:num_prompt] if scored is not None]
    if len(given) != num_prompt - 1:
        raise ValueError(f"vLLM's prompt logprobs do not cover the {num_prompt} prompt tokens")
    first: dict[str, Any] = {"token_id": prompt_token_ids[0], "logprob": None, "top": []}
    entries = [first]
    for token_id, scored in zip(prompt_token_ids[1:], given, strict=True):
        entry = logprob_entry(token_id, scored, num_top)
        entry["rank"] = scored[token_id].rank
        entries.append(entry)
    return [_named(entry, names) for entry in entries]


def _named(
    entry: dict[str, Any], names: Mapping[int, tuple[str, list[int] | None]]
) -> dict[str, Any]:
    for item in (entry, *entry["top"]):
        text, raw = names[int(item["token_id"])]
        item["token"] = text
        if raw is not None:
            item["bytes"] = raw
    return entry
