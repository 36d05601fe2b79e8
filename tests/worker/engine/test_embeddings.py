"""Embed requests in the engine: prefill only, pooled and normalised, batched with
generation (small runs on the real model)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from shared.models import FinishReason
from tests.reference import embedding_reference
from tests.worker.engine.conftest import EngineFactory
from tests.worker.engine.factories import make_request
from worker.engine import Engine, EngineRequest, RequestOutput

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in fixed-size blocks, so memory is never "
    "fragmented and prefixes can be shared between requests that start alike.",
]


def embed_request(engine: Engine, text: str, dimensions: int | None = None) -> EngineRequest:
    return make_request(engine.encode_prompt(text), task="embed", dimensions=dimensions)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def only_output(outputs: list[RequestOutput]) -> RequestOutput:
    assert len(outputs) == 1
    return outputs[0]


@pytest.fixture(scope="module")
def references(model_path: str) -> list[list[float]]:
    return embedding_reference(Path(model_path), TEXTS)


@pytest.mark.parametrize("fuse_layers", [True, False])
def test_an_embedding_is_the_pooled_normalised_hidden_state(
    make_engine: EngineFactory, references: list[list[float]], fuse_layers: bool
) -> None:
    engine = make_engine(fuse_layers=fuse_layers)
    requests = [embed_request(engine, text) for text in TEXTS]
    results = engine.generate(requests)
    for request, reference in zip(requests, references, strict=True):
        out = only_output(results[request.request_id])
        assert out.finish_reason is FinishReason.STOP
        assert out.new_token_ids == [] and out.num_output_tokens == 0
        assert out.num_prompt_tokens == len(request.prompt_token_ids)
        assert out.embedding is not None
        assert cosine(out.embedding, reference) > 0.9999


def test_chunked_embeddings_batched_with_generation_change_neither(
    make_engine: EngineFactory, references: list[list[float]]
) -> None:
    engine = make_engine(prefill_chunk_tokens=8)
    prompt = engine.encode_chat([{"role": "user", "content": "Name three colors."}])
    alone = engine.generate([make_request(prompt, max_tokens=6, ignore_eos=True)])
    gen = make_request(prompt, max_tokens=6, ignore_eos=True)
    embeds = [embed_request(engine, text) for text in TEXTS]
    mixed = engine.generate([gen, *embeds])
    tokens = [t for out in mixed[gen.request_id] for t in out.new_token_ids]
    assert tokens == [t for outs in alone.values() for out in outs for t in out.new_token_ids]
    for request, reference in zip(embeds, references, strict=True):
        embedding = only_output(mixed[request.request_id]).embedding
        assert embedding is not None and cosine(embedding, reference) > 0.9999


def test_dimensions_keeps_the_first_ones_normalised(
    engine: Engine, references: list[list[float]]
) -> None:
    request = embed_request(engine, TEXTS[0], dimensions=64)
    embedding = only_output(engine.generate([request])[request.request_id]).embedding
    assert embedding is not None and len(embedding) == 64
    assert math.isclose(math.fsum(v * v for v in embedding), 1.0, rel_tol=1e-6)
    assert cosine(embedding, references[0][:64]) > 0.9999


def test_more_dimensions_than_the_model_has_are_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="dimensions 4096 is more than this model's 576"):
        engine.add_request(embed_request(engine, TEXTS[0], dimensions=4096))
