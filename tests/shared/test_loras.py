"""The LoRA adapter registry, and refusal at submit of an adapter not in it (through
enqueue.lua, on fakeredis, a real redis-server and a real Redis Cluster)."""

from __future__ import annotations

import pytest
import redis

from producer.client import Client
from shared.errors import InvalidRequest, UnknownAdapter
from shared.keys import Keys, model_tag
from shared.loras import get_lora, list_loras, new_adapter, register_lora, remove_lora, split_model
from shared.models import GenerationRequest
from shared.settings import DEFAULT_MODEL

KEYS = Keys()


def test_register_list_replace_and_remove(any_redis: redis.Redis) -> None:
    assert register_lora(any_redis, KEYS, new_adapter("m", "poet", "/a/poet", rank=8))
    assert register_lora(any_redis, KEYS, new_adapter("m", "clerk", "/a/clerk", rank=8))
    assert not register_lora(
        any_redis, KEYS, new_adapter("m", "poet", "/b/poet", rank=8)
    )  # replaced
    assert [(a.name, a.path) for a in list_loras(any_redis, KEYS, "m")] == [
        ("clerk", "/a/clerk"),
        ("poet", "/b/poet"),
    ]
    assert list_loras(any_redis, KEYS, "other") == []
    assert remove_lora(any_redis, KEYS, "m", "poet")
    assert not remove_lora(any_redis, KEYS, "m", "poet")
    assert get_lora(any_redis, KEYS, "m", "poet") is None


@pytest.mark.parametrize(
    ("name", "path", "message"),
    [
        ("a:b", "/x", "name: String should match pattern"),
        ("a/b", "/x", "name: String should match pattern"),
        ("poet", "relative/dir", "give an absolute path"),
    ],
)
def test_a_bad_adapter_record_says_what_was_wrong(name: str, path: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        new_adapter("m", name, path)


def test_model_names_split_into_base_and_adapter() -> None:
    assert split_model("SmolLM2-135M-Instruct:poet") == ("SmolLM2-135M-Instruct", "poet")
    assert split_model("org/model:v1:poet") == ("org/model:v1", "poet")
    assert split_model("plain-model") is None
    assert split_model(":poet") is None
    assert split_model("model:a/b") is None


def test_an_unregistered_adapter_is_refused_at_submit(client: Client) -> None:
    with pytest.raises(UnknownAdapter, match="'poet' is not registered for model") as info:
        client.submit("hi", lora="poet")
    assert "tokenq lora add" in str(info.value)
    assert client.redis.zcard(KEYS.queue(model_tag(DEFAULT_MODEL))) == 0
    register_lora(client.redis, KEYS, new_adapter(DEFAULT_MODEL, "poet", "/adapters/poet", rank=8))
    handle = client.submit("hi", lora="poet")
    assert handle.position() == 0
    payload = client.redis.hget(KEYS.request(handle.id), "payload")
    assert payload is not None
    assert GenerationRequest.model_validate_json(payload).lora == "poet"


def test_an_adapter_of_another_model_is_refused(client: Client) -> None:
    register_lora(client.redis, KEYS, new_adapter("m", "poet", "/adapters/poet", rank=8))
    with pytest.raises(UnknownAdapter, match=f"not registered for model '{DEFAULT_MODEL}'"):
        client.submit("hi", lora="poet")
    assert client.submit("hi", model="m", lora="poet").position() == 0
