"""A reused idempotency key on every submit route: the same body answers the original
request, another body 409 ``idempotency_key_reused`` naming the key."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
REQUEST_ID = "x-tokenq-request-id"
# route, a body, the same body with one thing changed
ROUTES = [
    ("/v1/completions", {"model": MODEL, "prompt": "hi"}, {"prompt": "ho"}),
    ("/v1/chat/completions", CHAT, {"temperature": 0.5}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "background": True}, {"input": "ho"}),
    ("/v1/embeddings", {"model": MODEL, "input": "hi"}, {"input": "ho"}),
]


def assert_reused(reply: httpx.Response, key: str) -> None:
    assert reply.status_code == 409, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("idempotency_key_reused", "idempotency_key")
    assert f"idempotency_key {key!r} was already used" in error["message"]


def test_native_submit_answers_the_original_then_409_for_another_body(
    gateway: RunningGateway,
) -> None:
    body = {"model": MODEL, "prompt": "a", "idempotency_key": "x"}
    with gateway.client() as http:
        first = http.post("/v1/requests", json=body)
        again = http.post("/v1/requests", json={**body, "deadline": 30})
        other = http.post("/v1/requests", json={**body, "prompt": "b"})
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert_reused(other, "x")
    assert first.json()["id"] in other.json()["error"]["message"]


@pytest.mark.parametrize(("route", "body", "change"), ROUTES, ids=[r for r, _, _ in ROUTES])
def test_openai_routes_refuse_a_key_reused_with_another_body(
    gateway: RunningGateway, route: str, body: dict[str, Any], change: dict[str, Any]
) -> None:
    body = {**body, "idempotency_key": "k-1"}
    with gateway.client() as http:
        first = http.post(route, json=body)
        again = http.post(route, json=body)
        other = http.post(route, json={**body, **change})
    assert (first.status_code, again.status_code) == (200, 200), first.text
    assert first.headers[REQUEST_ID] == again.headers[REQUEST_ID]
    assert_reused(other, "k-1")
    assert len(gateway.redis.keys("tokenq:*:req:*")) == 1  # one request, run once


def test_a_tenants_key_is_its_own(keyed_gateway: RunningGateway) -> None:
    body = {"model": MODEL, "prompt": "a", "idempotency_key": "x"}
    with keyed_gateway.client() as http:
        ops = http.post("/v1/requests", json=body, headers={"Authorization": "Bearer sk-ops"})
        web = http.post(
            "/v1/requests", json={**body, "prompt": "b"}, headers={"Authorization": "Bearer sk-web"}
        )
    assert (ops.status_code, web.status_code) == (202, 202)
