"""Embeddings from a pooling vLLM worker (``--runner pooling``): through Redis and the
gateway's ``/v1/embeddings`` (the unmodified ``openai`` package) they equal vLLM's own
``LLM.embed`` on the same prompts (``bench/vllm_embed.py``, in .venv-vllm), and generation
sent to it is refused by name, at submit and at claim, while it serves on."""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from producer.client import Client
from shared.models import FinishReason
from shared.refusal import RequestRefused
from shared.settings import DEFAULT_MODEL
from tests.integration.vllm_stack import (
    ENGINE_ARGS,
    REPO,
    START_TIMEOUT_S,
    VLLM_ENV,
    VllmStack,
    start_stack,
    vllm_bin,
)
from worker.vllm_engine.config import POOLING_TYPES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The worker pools as the built-in engine does by default (``--pooling mean``); the
# reference is given the pooler the worker derives from that.
POOLING_ARGS: dict[str, Any] = {**ENGINE_ARGS, "runner": "pooling"}
REFERENCE_ARGS: dict[str, Any] = {
    **POOLING_ARGS,
    "pooler_config": {"pooling_type": POOLING_TYPES["mean"]},
}
TEXTS = [
    "A cat sat on the mat.",
    "Redis sorted sets keep the queue in priority order.",
    "Embeddings map text to vectors whose angles say how alike two texts are.",
]
REFERENCE_SCRIPT = REPO / "bench" / "vllm_embed.py"
TOLERANCE = 1e-5  # float32 both sides, the same kernels; batches may differ
RESULT_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path
) -> list[dict[str, Any]]:
    """vLLM's own ``LLM.embed`` on ``TEXTS``: per text its prompt ids and vector."""
    tmp = tmp_path_factory.mktemp("vllm-embed-ref")
    texts_path, out_path = tmp / "texts.json", tmp / "reference.json"
    texts_path.write_text(json.dumps(TEXTS))
    pairs = [f"{key}={json.dumps(value)}" for key, value in REFERENCE_ARGS.items()]
    cmd = [str(vllm_bin("python")), str(REFERENCE_SCRIPT), str(default_model_dir)]
    done = subprocess.run(
        [*cmd, str(texts_path), str(out_path), *pairs],
        capture_output=True,
        env={**os.environ, **VLLM_ENV, "PYTHONPATH": str(REPO)},
        timeout=START_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(
            f"vLLM's reference run failed (exit {done.returncode}):\n{done.stderr.decode()[-3000:]}"
        )
    results: list[dict[str, Any]] = json.loads(out_path.read_text())["results"]
    return results


@pytest.fixture(scope="module")
def pooling_stack(
    tmp_path_factory: pytest.TempPathFactory, reference: list[dict[str, Any]]
) -> Iterator[VllmStack]:
    """The pooling worker, started once vLLM's reference run has ended: never two vLLM
    engines at once beside the rest of the suite on a 24 GiB, 2-core box."""
    yield from start_stack(tmp_path_factory.mktemp("vllm-pooling"), POOLING_ARGS)


@pytest.fixture
def client(pooling_stack: VllmStack) -> Iterator[Client]:
    with Client(pooling_stack.redis_url) as c:
        yield c


@pytest.fixture
def sdk(pooling_stack: VllmStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{pooling_stack.gateway_url}/v1", api_key="unused")


def _normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(math.fsum(v * v for v in vector))
    return [v / norm for v in vector]


def test_embeddings_through_redis_equal_vllms_own(
    client: Client, reference: list[dict[str, Any]]
) -> None:
    vectors = client.embed(TEXTS, timeout=RESULT_TIMEOUT_S)
    for vector, expected in zip(vectors, reference, strict=True):
        assert len(vector) == len(expected["embedding"])
        assert vector == pytest.approx(expected["embedding"], abs=TOLERANCE)
        assert math.fsum(v * v for v in vector) == pytest.approx(1.0, abs=1e-6)


def test_openai_embeddings_equal_vllms_own(
    sdk: openai.OpenAI, reference: list[dict[str, Any]]
) -> None:
    reply = sdk.embeddings.create(model=DEFAULT_MODEL, input=TEXTS)  # base64, decoded
    assert [d.index for d in reply.data] == list(range(len(TEXTS)))
    for data, expected in zip(reply.data, reference, strict=True):
        assert data.embedding == pytest.approx(expected["embedding"], abs=TOLERANCE)
    num_prompt = sum(len(r["prompt_token_ids"]) for r in reference)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == num_prompt


def test_dimensions_keep_vllms_first_values_normalised_again(
    sdk: openai.OpenAI, client: Client, reference: list[dict[str, Any]]
) -> None:
    expected = _normalised(reference[1]["embedding"][:32])
    reply = sdk.embeddings.create(model=DEFAULT_MODEL, input=TEXTS[1], dimensions=32)
    assert reply.data[0].embedding == pytest.approx(expected, abs=TOLERANCE)
    (vector,) = client.embed(TEXTS[1], dimensions=32, timeout=RESULT_TIMEOUT_S)
    assert vector == pytest.approx(expected, abs=TOLERANCE)


def test_it_registers_its_embedding_size_and_that_it_does_not_generate(
    pooling_stack: VllmStack, sdk: openai.OpenAI, default_model_dir: Path
) -> None:
    hidden_size = json.loads((default_model_dir / "config.json").read_text())["hidden_size"]
    with pytest.raises(openai.BadRequestError, match=f"ask for {hidden_size} or fewer") as big:
        sdk.embeddings.create(model=DEFAULT_MODEL, input="hi", dimensions=hidden_size + 1)
    assert big.value.param == "dimensions"
    with Client(pooling_stack.redis_url) as c:
        limits = c._limits.get(DEFAULT_MODEL)
    assert limits is not None
    assert (limits.embedding_size, limits.generates) == (hidden_size, False)


def test_generation_is_refused_at_submit_naming_the_task(
    pooling_stack: VllmStack, sdk: openai.OpenAI, client: Client
) -> None:
    with pytest.raises(openai.BadRequestError, match="compute embeddings only") as refused:
        sdk.completions.create(model=DEFAULT_MODEL, prompt="Once upon a time", max_tokens=8)
    assert refused.value.param == "task"
    with pytest.raises(RequestRefused, match="compute embeddings only") as raised:
        client.submit("Once upon a time", max_tokens=8)
    assert raised.value.refusal.param == "task"
    assert pooling_stack.alive()


def test_generation_that_reaches_it_is_refused_and_it_serves_on(
    pooling_stack: VllmStack, client: Client, reference: list[dict[str, Any]]
) -> None:
    # A client that read the model's limits before this worker registered them (the
    # cache keeps them LIMITS_CACHE_S): its generation request reaches the worker.
    client._limits.ttl_s = 3600.0
    client._limits._keep(DEFAULT_MODEL, None)
    result = client.submit("Once upon a time", max_tokens=8).result(RESULT_TIMEOUT_S)
    assert result.finish_reason is FinishReason.ERROR
    assert result.refusal is not None and result.refusal.param == "task"
    assert "computes embeddings only" in result.refusal.message
    assert result.token_ids == ()
    assert pooling_stack.alive()
    (vector,) = client.embed(TEXTS[0], timeout=RESULT_TIMEOUT_S)
    assert vector == pytest.approx(reference[0]["embedding"], abs=TOLERANCE)
