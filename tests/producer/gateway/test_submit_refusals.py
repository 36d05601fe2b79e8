"""What the model's workers registered they cannot run is refused by the gateway at
submit, in each API's error shape naming the field, before anything is queued: no
worker runs here, so an answer that waited for one would never come."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from producer.embedded import EmbeddedRedis
from producer.gateway.app import create_app
from producer.gateway.config import GatewayConfig
from shared.keys import Keys, model_tag
from shared.limits import ModelLimits
from shared.registry import GUIDED_FIELD, LIMITS_FIELD, register_worker
from shared.settings import Settings
from tests.producer.gateway.conftest import ThreadedServer

MODEL = "limited-model"
KEYS = Keys()
# A small context, and a vocabulary none of whose tokens spells more than 4 bytes.
LIMITS = ModelLimits(vocab_size=1000, max_model_len=64, max_bytes_per_token=4)
LONG_TEXT = "word " * 100  # 400 bytes but spaces: at least 100 tokens, over 64
FEW: dict[str, Any] = {"max_tokens": 4}
NATIVE_FEW: dict[str, Any] = {"sampling": FEW}
# An answer that came from a worker would take at least this long; none runs here.
AT_ONCE_S = 2.0


@pytest.fixture
def gateway(redis_server: EmbeddedRedis) -> Iterator[tuple[httpx.Client, redis.Redis]]:
    connection = redis.Redis.from_url(redis_server.url)
    connection.flushall()
    settings = Settings(redis_url=redis_server.url)
    fields: dict[str, Any] = {
        "model": MODEL,
        GUIDED_FIELD: 1,
        LIMITS_FIELD: LIMITS.model_dump_json(),
    }
    pipe = connection.pipeline(transaction=False)
    register_worker(pipe, KEYS, settings, "w-registered", fields)  # its record, no process
    pipe.execute()
    with (
        ThreadedServer(create_app(settings, GatewayConfig())) as url,
        httpx.Client(base_url=url, timeout=AT_ONCE_S) as http,
    ):
        yield http, connection
    connection.close()


def refused(http: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    reply = http.post(path, json=body)
    assert time.monotonic() - started < AT_ONCE_S
    assert reply.status_code == 400, reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


def queued(connection: redis.Redis) -> int:
    return int(connection.zcard(KEYS.queue(model_tag(MODEL))))


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/requests", {"prompt": LONG_TEXT, **NATIVE_FEW}, "prompt"),
        (
            "/v1/requests",
            {"messages": [{"role": "user", "content": LONG_TEXT}], **NATIVE_FEW},
            "messages",
        ),
        ("/v1/requests", {"prompt": "hi", "sampling": {"max_tokens": 64}}, "sampling.max_tokens"),
        (
            "/v1/requests",
            {"prompt": "hi", "sampling": {"logit_bias": {"1000": 1}}},
            "sampling.logit_bias",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": LONG_TEXT}], **FEW},
            "messages",
        ),
        ("/v1/completions", {"prompt": [1] * 70, **FEW}, "prompt"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 64}, "max_tokens"),
        ("/v1/responses", {"input": LONG_TEXT, "max_output_tokens": 4}, "input"),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 64}, "max_output_tokens"),
        ("/v1/embeddings", {"input": LONG_TEXT}, "input"),
    ],
)
def test_an_over_long_request_is_refused_at_submit_naming_the_field(
    gateway: tuple[httpx.Client, redis.Redis], path: str, body: dict[str, Any], param: str
) -> None:
    http, connection = gateway
    error = refused(http, path, {"model": MODEL, **body})
    assert error["param"] == param
    assert "context" in error["message"] or "vocabulary" in error["message"]
    assert queued(connection) == 0


def test_the_code_says_what_kind_of_mistake(gateway: tuple[httpx.Client, redis.Redis]) -> None:
    http, _ = gateway
    too_long = refused(http, "/v1/completions", {"model": MODEL, "prompt": [1] * 70, **FEW})
    outside = refused(http, "/v1/completions", {"model": MODEL, "prompt": [1000], **FEW})
    assert too_long["code"] == "context_length_exceeded"
    assert outside["code"] == "invalid_value"


def test_what_might_fit_is_queued_for_a_worker_to_decide(
    gateway: tuple[httpx.Client, redis.Redis],
) -> None:
    http, connection = gateway
    # 30 words of 4 bytes: at least 30 tokens (the worker counts them), within 64.
    reply = http.post(
        "/v1/requests", json={"model": MODEL, "prompt": "word " * 30, "sampling": {"max_tokens": 4}}
    )
    assert reply.status_code == 202, reply.text
    assert queued(connection) == 1
