"""The sampling fields every surface shares: bounds named, schemas checked up front."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from producer.requests import build_request
from shared.errors import InvalidRequest
from shared.models import GenerationRequest, SamplingParams
from shared.settings import Settings


def test_the_python_client_takes_guided_and_penalty_fields() -> None:
    request = build_request(
        Settings(),
        "hi",
        guided_json={"type": "object"},
        logit_bias={"5": -100},
        presence_penalty=1.5,
        frequency_penalty=-0.5,
    )
    s = request.sampling
    assert (s.guided_json, s.logit_bias, s.presence_penalty, s.frequency_penalty) == (
        {"type": "object"},
        {5: -100.0},
        1.5,
        -0.5,
    )
    # The payload read back from Redis is the same request.
    assert GenerationRequest.model_validate_json(request.model_dump_json()) == request


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"presence_penalty": -2.1}, "sampling.presence_penalty"),
        ({"frequency_penalty": 9}, "sampling.frequency_penalty"),
        ({"logit_bias": {"3": -101}}, "sampling.logit_bias.3"),
        ({"guided_regex": "a", "guided_json": {}}, "not guided_json and guided_regex"),
        ({"guided_json": {"properties": {"x": {"uniqueItems": True}}}}, "'uniqueItems'"),
        ({"top_k": 2**64}, "sampling.top_k"),
        ({"top_k": 2**63}, "sampling.top_k"),
        ({"stop_token_ids": [2**40]}, "sampling.stop_token_ids.0"),
        ({"logit_bias": {str(2**64): 1}}, "sampling.logit_bias"),
        ({"temperature": 1e-39}, "at least 0.001"),
        ({"temperature": float("nan")}, "sampling.temperature"),
        ({"top_p": float("inf")}, "sampling.top_p"),
        ({"repetition_penalty": 1e-30}, "sampling.repetition_penalty"),
        ({"min_tokens": 2**70}, "sampling.min_tokens"),
    ],
)
def test_bad_values_name_the_field(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid request") as caught:
        build_request(Settings(), "hi", **fields)
    assert says in str(caught.value)


def test_a_property_named_like_a_keyword_is_fine() -> None:
    schema = {
        "type": "object",
        "properties": {"not": {"type": "string"}, "if": {"type": "integer"}},
    }
    assert SamplingParams(guided_json=schema).guided_json == schema


def test_remote_refs_are_refused() -> None:
    with pytest.raises(ValidationError, match="only local refs"):
        SamplingParams(guided_json={"$ref": "https://example.com/s.json"})


def test_the_python_client_takes_token_id_prompts_and_template_kwargs() -> None:
    ids = build_request(Settings(), prompt_token_ids=[1, 2, 3]).prompt_token_ids
    assert ids == (1, 2, 3)
    chat = build_request(
        Settings(),
        messages=[{"role": "user", "content": "hi"}],
        chat_template_kwargs={"enable_thinking": False},
    )
    assert chat.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(InvalidRequest, match=r"prompt_token_ids\.1"):
        build_request(Settings(), prompt_token_ids=[1, -2])
    with pytest.raises(InvalidRequest, match="exactly one of prompt, prompt_token_ids"):
        build_request(Settings(), "hi", prompt_token_ids=[1])
    with pytest.raises(InvalidRequest, match="'tokenize' is the chat template call's own"):
        build_request(
            Settings(),
            messages=[{"role": "user", "content": "hi"}],
            chat_template_kwargs={"tokenize": False},
        )
