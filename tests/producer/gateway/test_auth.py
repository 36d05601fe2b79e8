"""API keys: tenants and the highest priority a key may use."""

from __future__ import annotations

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
