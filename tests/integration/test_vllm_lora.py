"""LoRA adapters from tokenq's registry on ``tokenq worker --engine vllm --enable-lora``,
against vLLM's own ``LLM.generate`` with the same ``LoRARequest``. The worker is this
module's own (tests/integration/vllm_stack.py, LoRA on), stopped when the module ends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from producer.client import Client, Handle
from shared.keys import Keys
from shared.loras import register_lora
from shared.models import LoraAdapter, TokenEvent
from shared.settings import DEFAULT_MODEL, get_settings
from tests.integration.vllm_stack import (
    LORA_ENGINE_ARGS,
    MAX_LORA_RANK,
    VllmStack,
    start_stack,
    vllm_reference,
)
from tests.lora_adapters import SPECS, make_adapter

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RESULT_TIMEOUT_S = 600.0
SEA_CASE: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Write one line about the sea."}],
    "max_tokens": 12,
    "temperature": 0.0,
}
ADAPTER = SPECS[1]  # rank 4: within the worker's MAX_LORA_RANK; changes SEA_CASE's answer


@pytest.fixture(scope="module")
def lora_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmStack]:
    yield from start_stack(tmp_path_factory.mktemp("vllm-lora"), LORA_ENGINE_ARGS)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    return make_adapter(str(default_model_dir), ADAPTER, tmp_path_factory.mktemp("loras"))


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path, adapter: Path
) -> list[dict[str, Any]]:
    """vLLM's own answers to SEA_CASE, without and then with the adapter."""
    cases = [SEA_CASE, {**SEA_CASE, "lora": {"name": ADAPTER.name, "path": str(adapter)}}]
    tmp = tmp_path_factory.mktemp("vllm-lora-ref")
    return vllm_reference(default_model_dir, cases, tmp, LORA_ENGINE_ARGS)


@pytest.fixture
def client(lora_stack: VllmStack) -> Iterator[Client]:
    with Client(lora_stack.redis_url) as c:
        yield c


def _register(stack: VllmStack, name: str, path: str, rank: int) -> None:
    record = LoraAdapter(name=name, model=DEFAULT_MODEL, path=path, rank=rank)
    with redis.Redis.from_url(stack.redis_url) as connection:
        register_lora(connection, Keys(get_settings().namespace), record)


def _as_vllms(handle: Handle, expected: dict[str, Any]) -> None:
    result = handle.result(timeout=RESULT_TIMEOUT_S)
    assert result.error is None, result.error
    assert (list(result.token_ids), result.text) == (expected["token_ids"], expected["text"])
    streamed = [
        token_id
        for entry in handle.stream(timeout=RESULT_TIMEOUT_S)
        if isinstance(entry.event, TokenEvent)
        for token_id in entry.event.token_ids
    ]
    assert streamed == expected["token_ids"]


def _registry_entry(stack: VllmStack) -> dict[str, str]:
    keys = Keys(get_settings().namespace)
    with redis.Redis.from_url(stack.redis_url, decode_responses=True) as connection:
        (worker_id,) = connection.zrange(keys.workers(), 0, -1)
        fields: dict[str, str] = connection.hgetall(keys.worker(worker_id))
        return fields


def test_an_adapter_changes_the_output_as_vllms_own_lora_does(
    lora_stack: VllmStack, client: Client, adapter: Path, reference: list[dict[str, Any]]
) -> None:
    base, adapted = reference
    assert adapted["token_ids"] != base["token_ids"]  # the adapter changes this answer
    _register(lora_stack, ADAPTER.name, str(adapter), ADAPTER.rank)
    with_it = client.submit(model=DEFAULT_MODEL, **SEA_CASE, lora=ADAPTER.name)
    without = client.submit(model=DEFAULT_MODEL, **SEA_CASE)
    _as_vllms(with_it, adapted)
    _as_vllms(without, base)
    assert int(_registry_entry(lora_stack)["max_lora_rank"]) == MAX_LORA_RANK
    give_up = time.monotonic() + 60  # the registry entry is written on a heartbeat
    while ADAPTER.name not in _registry_entry(lora_stack).get("loras", "").split(","):
        assert time.monotonic() < give_up, "the registry never showed the adapter resident"
        time.sleep(0.5)


def test_an_adapter_vllm_cannot_load_is_refused_by_name_and_the_worker_lives(
    lora_stack: VllmStack, client: Client, tmp_path: Path
) -> None:
    (tmp_path / "adapter_config.json").write_text("{}")  # no weights, no rank
    _register(lora_stack, "broken", str(tmp_path), 1)
    result = client.submit(model=DEFAULT_MODEL, **SEA_CASE, lora="broken").result(timeout=300)
    assert result.finish_reason.value == "error"
    assert result.refusal is not None and result.refusal.param == "lora", result.error
    fine = client.submit(model=DEFAULT_MODEL, prompt="Hello", max_tokens=4).result(timeout=300)
    assert fine.error is None and lora_stack.alive()


def test_prompt_logprobs_are_refused_at_submit_while_it_serves_adapters(
    lora_stack: VllmStack,
) -> None:
    # vLLM's engine core dies scoring a prompt beside another request with LoRA on.
    body = {"model": DEFAULT_MODEL, "prompt": "Hello", "max_tokens": 4, "prompt_logprobs": 1}
    reply = httpx.post(f"{lora_stack.gateway_url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "prompt_logprobs"
    assert lora_stack.alive()
