"""cache_salt (vLLM's field) on the native and OpenAI routes: kept with the request, a
bad one refused with 400 naming it; and two keys' tenants sending the same long prompt
get different prefix fingerprints, so no claim takes one as warm for the other."""

from __future__ import annotations

import httpx
import pytest

from shared.keys import Keys, model_tag
from shared.models import MAX_CACHE_SALT_CHARS, GenerationRequest
from shared.replies import text
from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL

OPS = {"Authorization": "Bearer sk-ops"}
WEB = {"Authorization": "Bearer sk-web"}
LONG_PROMPT = "You are the assistant of a bank. " * 40  # long enough to be fingerprinted
KEYS = Keys()


def stored(gateway: RunningGateway, request_id: str) -> GenerationRequest:
    payload = gateway.redis.hget(KEYS.request(request_id), "payload")
    return GenerationRequest.model_validate_json(text(payload or b""))


def fingerprints(gateway: RunningGateway, request_id: str) -> list[str]:
    return text(gateway.redis.hget(KEYS.prefixes(model_tag(MODEL)), request_id) or b"").split()


def submit(http: httpx.Client, headers: dict[str, str], **fields: object) -> str:
    body = {"model": MODEL, "prompt": LONG_PROMPT, **fields}
    reply = http.post("/v1/requests", json=body, headers=headers)
    assert reply.status_code == 202, reply.text
    request_id: str = reply.json()["id"]
    return request_id


def test_two_keys_tenants_get_different_fingerprints_for_one_prompt(
    keyed_gateway: RunningGateway,
) -> None:
    keyed_gateway.worker.stop()  # they stay queued, with their fingerprints
    with keyed_gateway.client() as http:
        ops, web, ops_again = (submit(http, h) for h in (OPS, WEB, OPS))
        salted = submit(http, OPS, cache_salt="user-1")
    assert stored(keyed_gateway, salted).cache_salt == "user-1"
    first = {rid: fingerprints(keyed_gateway, rid)[0] for rid in (ops, web, ops_again, salted)}
    assert first[ops] == first[ops_again]
    assert len({first[ops], first[web], first[salted]}) == 3


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/requests", {"model": MODEL, "prompt": "hi"}),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        ),
    ],
)
def test_each_route_takes_a_cache_salt_and_refuses_a_bad_one(
    gateway: RunningGateway, path: str, body: dict[str, object]
) -> None:
    with gateway.client() as http:
        good = http.post(path, json={**body, "cache_salt": "user-1"})
        bad = [
            http.post(path, json={**body, "cache_salt": value})
            for value in ("", "x" * (MAX_CACHE_SALT_CHARS + 1), "a\nb", 7)
        ]
    assert good.status_code in (200, 202), good.text
    for reply in bad:
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "cache_salt"
