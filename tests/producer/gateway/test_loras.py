"""LoRA adapters through the gateway: ``model: "base:adapter"`` on the OpenAI routes,
``lora`` on the native route, refusal of an unknown adapter, and /v1/models."""

from __future__ import annotations

import httpx

from shared.keys import Keys
from shared.loras import new_adapter, register_lora
from shared.models import GenerationRequest
from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL, expected_text

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def stored(gateway: RunningGateway, reply: httpx.Response) -> GenerationRequest:
    request_id = reply.headers.get("x-tokenq-request-id") or reply.json()["id"]
    payload = gateway.redis.hget(Keys().request(request_id), "payload")
    assert payload is not None
    return GenerationRequest.model_validate_json(payload)


def test_openai_routes_name_an_adapter_as_base_colon_adapter(gateway: RunningGateway) -> None:
    register_lora(gateway.redis, Keys(), new_adapter(MODEL, "poet", "/adapters/poet", rank=8))
    with gateway.client() as http:
        reply = http.post("/v1/chat/completions", json={**CHAT, "model": f"{MODEL}:poet"})
    assert reply.status_code == 200
    assert reply.json()["model"] == f"{MODEL}:poet"
    assert reply.json()["choices"][0]["message"]["content"] == expected_text(3)
    request = stored(gateway, reply)
    assert (request.model, request.lora) == (MODEL, "poet")


def test_an_unknown_adapter_is_refused_on_every_route(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        chat = http.post("/v1/chat/completions", json={**CHAT, "model": f"{MODEL}:nobody"})
        text = http.post("/v1/completions", json={"model": f"{MODEL}:nobody", "prompt": "hi"})
        native = http.post("/v1/requests", json={"model": MODEL, "prompt": "hi", "lora": "nobody"})
    for reply in (chat, text, native):
        assert reply.status_code == 404
        error = reply.json()["error"]
        assert error["code"] == "lora_not_found"
        assert f"'nobody' is not registered for model '{MODEL}'" in error["message"]
    assert gateway.redis.zcard(Keys().queue(_tag())) == 0


def test_the_native_route_takes_a_lora_field(gateway: RunningGateway) -> None:
    register_lora(gateway.redis, Keys(), new_adapter(MODEL, "poet", "/adapters/poet", rank=8))
    with gateway.client() as http:
        reply = http.post("/v1/requests", json={"model": MODEL, "prompt": "hi", "lora": "poet"})
    assert reply.status_code == 202
    assert stored(gateway, reply).lora == "poet"


def test_models_lists_each_adapter_under_its_base(gateway: RunningGateway) -> None:
    register_lora(gateway.redis, Keys(), new_adapter(MODEL, "poet", "/adapters/poet", rank=8))
    register_lora(gateway.redis, Keys(), new_adapter("not-served", "x", "/adapters/x", rank=8))
    with gateway.client() as http:
        listed = http.get("/v1/models").json()["data"]
        one = http.get(f"/v1/models/{MODEL}:poet")
    assert [(m["id"], m["parent"]) for m in listed] == [(MODEL, None), (f"{MODEL}:poet", MODEL)]
    assert one.status_code == 200
    assert one.json()["parent"] == MODEL


def _tag() -> str:
    from shared.keys import model_tag

    return model_tag(MODEL)
