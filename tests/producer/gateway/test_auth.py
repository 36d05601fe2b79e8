"""API keys: tenants and the highest priority a key may use."""

from __future__ import annotations

import httpx
import pytest

from producer.gateway.auth import Principal, priority_for
from producer.gateway.errors import ApiError
from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
WEB = {"Authorization": "Bearer sk-web"}


def test_no_priority_asked_gets_normal_capped_by_the_key() -> None:
    assert priority_for(Principal("t", 100), None) == 50
    assert priority_for(Principal("t", 25), None) == 25
    assert priority_for(Principal("t", 50), "low") == 25


def test_asking_above_the_keys_maximum_is_403() -> None:
    with pytest.raises(ApiError, match="above this API key's maximum") as caught:
        priority_for(Principal("t", 50), "high")
    assert caught.value.status == 403


def test_missing_or_unknown_key_is_401(keyed_gateway: RunningGateway) -> None:
    with keyed_gateway.client() as http:
        missing = http.post("/v1/chat/completions", json=CHAT)
        unknown = http.get("/v1/models", headers={"Authorization": "Bearer sk-nope"})
    assert (missing.status_code, unknown.status_code) == (401, 401)
    assert missing.json()["error"]["type"] == "authentication_error"
    assert missing.headers["www-authenticate"] == "Bearer"


def test_a_key_is_held_to_its_maximum_priority(keyed_gateway: RunningGateway) -> None:
    with keyed_gateway.client() as http:
        allowed = http.post("/v1/chat/completions", json=CHAT, headers=WEB)
        refused = http.post(
            "/v1/requests", json={"model": MODEL, "prompt": "x", "priority": 90}, headers=WEB
        )
        ops = http.post(
            "/v1/requests",
            json={"model": MODEL, "prompt": "x", "priority": "critical"},
            headers={"Authorization": "Bearer sk-ops"},
        )
    assert allowed.status_code == 200
    assert refused.status_code == 403
    assert refused.json()["error"] == {
        "message": "priority 90 is above this API key's maximum (normal); ask for normal or less",
        "type": "permission_error",
        "param": "priority",
        "code": "priority_not_allowed",
    }
    assert ops.status_code == 202 and ops.json()["priority"] == 100


def test_health_needs_no_key(keyed_gateway: RunningGateway) -> None:
    with keyed_gateway.client() as http:
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").status_code == 200
        assert http.get("/health").status_code == 200


OPS = {"Authorization": "Bearer sk-ops"}


def _submit(http: httpx.Client, headers: dict[str, str], **fields: object) -> httpx.Response:
    body = {"model": MODEL, "prompt": "x", **fields}
    return http.post("/v1/requests", json=body, headers=headers)


def _events_answer(http: httpx.Client, request_id: str, headers: dict[str, str]) -> httpx.Response:
    """The answer to an events request, read only if it is not a stream (which, for a
    queued request, would not end)."""
    with http.stream("GET", f"/v1/requests/{request_id}/events", headers=headers) as answer:
        if answer.status_code != 200:
            answer.read()
        return answer


def test_a_tenant_cannot_see_or_cancel_another_tenants_request(
    keyed_gateway: RunningGateway,
) -> None:
    keyed_gateway.worker.stop()  # it stays queued, so a cancel would take effect
    with keyed_gateway.client() as http:
        request_id = _submit(http, WEB).json()["id"]
        as_ops = [
            http.get(f"/v1/requests/{request_id}", headers=OPS),
            _events_answer(http, request_id, OPS),
            http.delete(f"/v1/requests/{request_id}", headers=OPS),
        ]
        as_web = http.get(f"/v1/requests/{request_id}", headers=WEB)
    assert [r.status_code for r in as_ops] == [404, 404, 404]
    message = f"request {request_id} does not exist (or has expired)"
    assert all(r.json()["error"]["message"] == message for r in as_ops)  # nothing leaks
    assert as_web.status_code == 200
    assert (as_web.json()["state"], as_web.json()["tenant"]) == ("queued", "web")


def test_the_same_idempotency_key_from_two_tenants_makes_two_requests(
    keyed_gateway: RunningGateway,
) -> None:
    keyed_gateway.worker.stop()
    with keyed_gateway.client() as http:
        web = _submit(http, WEB, idempotency_key="order-1")
        ops = _submit(http, OPS, idempotency_key="order-1")
        web_again = _submit(http, WEB, idempotency_key="order-1")
    assert (web.status_code, ops.status_code, web_again.status_code) == (202, 202, 200)
    assert ops.json()["id"] != web.json()["id"] == web_again.json()["id"]


def test_an_open_gateway_sees_every_request(gateway: RunningGateway) -> None:
    gateway.worker.stop()
    with gateway.client() as http:
        request_id = _submit(http, {}).json()["id"]
        view = http.get(f"/v1/requests/{request_id}")
        cancel = http.delete(f"/v1/requests/{request_id}")
    assert (view.status_code, view.json()["tenant"]) == (200, "default")
    assert cancel.json()["outcome"] == "cancelled"


def test_an_x_api_key_header_is_a_key_as_anthropics_clients_send_it(
    keyed_gateway: RunningGateway,
) -> None:
    with keyed_gateway.client() as http:
        known = http.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": "sk-web"})
        unknown = http.get("/v1/models", headers={"x-api-key": "sk-nope"})
        anthropic = http.post("/v1/messages", json=CHAT)
    assert known.status_code == 200
    assert unknown.status_code == 401 and unknown.json()["error"]["message"] == "unknown API key"
    # No key on an Anthropic route: refused in Anthropic's error shape.
    assert anthropic.status_code == 401
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "authentication_error"
