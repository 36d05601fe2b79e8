"""Embeddings through the queue: the unmodified ``openai`` package and ``Client.embed``
against a gateway process and a worker on the default model."""

from __future__ import annotations

import base64
import math
import struct
import threading
from pathlib import Path

import openai
import pytest

from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.settings import DEFAULT_MODEL, Settings
from tests.reference import embedding_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TEXTS = ["A cat sat on the mat.", "Redis sorted sets keep the queue in priority order."]


@pytest.fixture(scope="module")
def references() -> list[list[float]]:
    from worker.model_store import resolve_model

    return embedding_reference(Path(resolve_model(DEFAULT_MODEL)), TEXTS)


@pytest.fixture(scope="module")
def client(openai_client: openai.OpenAI) -> openai.OpenAI:
    return openai_client


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_openai_embeddings_equal_transformers(
    client: openai.OpenAI, references: list[list[float]]
) -> None:
    # Left to itself, the openai package asks for base64 and decodes it.
    reply = client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS)
    assert [d.index for d in reply.data] == [0, 1]
    for data, reference in zip(reply.data, references, strict=True):
        assert cosine(data.embedding, reference) > 0.9999
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > len(TEXTS)


def test_float_and_base64_encodings_carry_the_same_vector(client: openai.OpenAI) -> None:
    floats = client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS[0], encoding_format="float")
    encoded = client.embeddings.create(
        model=DEFAULT_MODEL, input=TEXTS[0], encoding_format="base64"
    )
    raw = base64.b64decode(str(encoded.data[0].embedding))
    decoded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert decoded == pytest.approx(floats.data[0].embedding, abs=1e-7)


def test_embeddings_batched_with_generation(
    client: openai.OpenAI, references: list[list[float]]
) -> None:
    def generate() -> None:
        client.completions.create(
            model=DEFAULT_MODEL,
            prompt="Once upon a time",
            max_tokens=12,
            extra_body={"ignore_eos": True},
        )

    talkers = [threading.Thread(target=generate) for _ in range(2)]
    for t in talkers:
        t.start()
    reply = client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS[1], dimensions=32)
    for t in talkers:
        t.join()
    (data,) = reply.data
    assert len(data.embedding) == 32
    assert cosine(data.embedding, references[1][:32]) > 0.9999


def test_client_embed(
    redis_server: EmbeddedRedis, client: openai.OpenAI, references: list[list[float]]
) -> None:
    with Client(settings=Settings(redis_url=redis_server.url)) as native:
        vectors = native.embed(TEXTS, model=DEFAULT_MODEL, priority="high", timeout=60)
    for vector, reference in zip(vectors, references, strict=True):
        assert cosine(vector, reference) > 0.9999


def test_empty_and_blank_input_are_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match=r"input: give 1 to 2048 texts \(got 0\)"):
        client.embeddings.create(model=DEFAULT_MODEL, input=[])
    with pytest.raises(openai.BadRequestError, match=r"input\[1\]: a text to embed must not be"):
        client.embeddings.create(model=DEFAULT_MODEL, input=["fine", "   "])


def test_more_dimensions_than_the_model_has_get_400_naming_its_size(
    client: openai.OpenAI,
) -> None:
    from transformers import AutoConfig

    from worker.model_store import resolve_model

    size = AutoConfig.from_pretrained(resolve_model(DEFAULT_MODEL)).hidden_size
    with pytest.raises(openai.BadRequestError, match=f"ask for {size} or fewer") as refused:
        client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS[0], dimensions=size + 1)
    assert refused.value.param == "dimensions"
    reply = client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS[0], dimensions=size)
    assert len(reply.data[0].embedding) == size
