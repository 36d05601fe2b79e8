"""A key's weight and rate limits at the gateway: the weight rides on its requests
whatever the body says, and a key over a limit gets OpenAI's 429 on every route."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from producer.embedded import EmbeddedRedis
from shared.keys import Keys
from shared.models import GenerationRequest
from shared.replies import text
from tests.producer.gateway.conftest import RunningGateway, serve
from tests.producer.gateway.scripted import MODEL

KEYS = {
    "sk-heavy": {"tenant": "heavy", "weight": 3, "requests_per_min": 2},
    "sk-tok": {"tenant": "tok", "tokens_per_min": 50},
}
HEAVY = {"Authorization": "Bearer sk-heavy"}


@pytest.fixture
def limited(redis_server: EmbeddedRedis) -> Iterator[RunningGateway]:
    yield from serve(redis_server, orjson.dumps(KEYS).decode())


def test_the_keys_weight_rides_on_its_requests(limited: RunningGateway) -> None:
    body = {"model": MODEL, "prompt": "x", "metadata": {"tenant_weight": 1000}}
    with limited.client() as http:
        reply = http.post("/v1/requests", json=body, headers=HEAVY)
    assert reply.status_code == 202, reply.text
    payload = limited.redis.hget(Keys().request(reply.json()["id"]), "payload")
    stored = GenerationRequest.model_validate_json(text(payload))
    assert (stored.tenant, stored.tenant_weight) == ("heavy", 3.0)


def test_over_requests_per_minute_answers_429_with_openais_headers(
    limited: RunningGateway,
) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with limited.client() as http:
        plain = {"model": MODEL, "prompt": "x"}
        admitted = [http.post("/v1/requests", json=plain, headers=HEAVY) for _ in "12"]
        refused = http.post("/v1/chat/completions", json=chat, headers=HEAVY)
    assert [r.status_code for r in admitted] == [202, 202]
    remaining = [r.headers["x-ratelimit-remaining-requests"] for r in admitted]
    assert remaining == ["1", "0"]  # every answer carries the figures, as OpenAI's do
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "2 requests per minute" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == "30"  # one request's share of a minute
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")


def test_a_request_over_the_token_limit_can_never_fit(limited: RunningGateway) -> None:
    body = {"model": MODEL, "prompt": "x", "sampling": {"max_tokens": 100}}
    with limited.client() as http:
        reply = http.post("/v1/requests", json=body, headers={"Authorization": "Bearer sk-tok"})
    assert reply.status_code == 429
    assert "lower max_tokens" in reply.json()["error"]["message"]
    assert "retry-after" not in reply.headers
    assert reply.headers["x-ratelimit-limit-tokens"] == "50"
