"""LoRA adapters end to end: registered through the gateway's admin route, named by
the unmodified ``openai`` package (``model: "base:adapter"``) and by ``Client``
(``lora=``), run by a real worker process against a real redis-server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.errors import UnknownAdapter
from shared.keys import Keys
from shared.replies import text
from shared.settings import DEFAULT_MODEL, Settings
from tests.integration.openai_stack import openai_stack
from tests.lora_adapters import SPECS, make_adapter, merged_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOKEN = "lora-admin-token"
TEXT = "Write one line about the sea."
QUESTION = [{"role": "user", "content": TEXT}]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def model_path() -> str:
    from worker.model_store import resolve_model

    return str(resolve_model(DEFAULT_MODEL))


@pytest.fixture(scope="module")
def adapter(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(
        model_path, SPECS[1], tmp_path_factory.mktemp("loras")
    )  # changes this answer


@pytest.fixture(scope="module")
def expected(model_path: str, adapter: Path) -> str:
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(model_path)
    encoded = tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    [tokens] = merged_greedy(model_path, adapter, [list(encoded["input_ids"])], MAX_TOKENS)
    text: str = tokenizer.decode(tokens, skip_special_tokens=True)
    return text


@pytest.fixture(scope="module")
def client(
    redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[openai.OpenAI]:
    log_dir = tmp_path_factory.mktemp("worker")
    with openai_stack(redis_server.url, log_dir, TOKENQ_ADMIN_TOKEN=TOKEN) as c:
        yield c


def register(client: openai.OpenAI, name: str, path: Path) -> httpx.Response:
    admin = str(client.base_url).removesuffix("/v1/")
    body = {"model": DEFAULT_MODEL, "name": name, "path": str(path)}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return httpx.post(f"{admin}/admin/api/loras", json=body, headers=headers, timeout=10)


def test_an_adapter_registered_at_the_gateway_serves_openai_and_client_requests(
    client: openai.OpenAI, redis_server: EmbeddedRedis, adapter: Path, expected: str
) -> None:
    assert register(client, "pirate", adapter).status_code == 201
    assert f"{DEFAULT_MODEL}:pirate" in [m.id for m in client.models.list()]
    reply = client.chat.completions.create(
        model=f"{DEFAULT_MODEL}:pirate",
        messages=[{"role": "user", "content": TEXT}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert reply.choices[0].message.content == expected
    assert reply.model == f"{DEFAULT_MODEL}:pirate"
    with Client(settings=Settings(redis_url=redis_server.url)) as tokenq:
        handle = tokenq.submit(
            messages=QUESTION, lora="pirate", max_tokens=MAX_TOKENS, temperature=0
        )
        assert handle.result(timeout=120).text == expected
        base = tokenq.submit(messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0)
        assert base.result(timeout=120).text != expected  # the adapter made the difference
    assert "pirate" in _registered_loras(redis.Redis.from_url(redis_server.url))


def test_an_unknown_adapter_is_refused_before_it_is_queued(
    client: openai.OpenAI, redis_server: EmbeddedRedis
) -> None:
    with pytest.raises(openai.NotFoundError, match="'nobody' is not registered for model"):
        client.chat.completions.create(
            model=f"{DEFAULT_MODEL}:nobody",
            messages=[{"role": "user", "content": TEXT}],
            max_tokens=2,
        )
    with (
        Client(settings=Settings(redis_url=redis_server.url)) as tokenq,
        pytest.raises(UnknownAdapter, match="tokenq lora add"),
    ):
        tokenq.submit("hi", lora="nobody")


def _registered_loras(connection: redis.Redis) -> str:
    """The resident adapters the worker's registry entry reports (within a few beats)."""
    keys = Keys()
    for _ in range(100):
        ids: Any = connection.zrange(keys.workers(), 0, -1)
        for worker_id in ids:
            value: Any = connection.hget(keys.worker(text(worker_id)), "loras")
            if value:
                return text(value)
        time.sleep(0.1)
    return ""
