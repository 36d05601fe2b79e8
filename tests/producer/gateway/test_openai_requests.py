"""OpenAI bodies become GenerationRequests; what cannot be served is refused by name."""

from __future__ import annotations

import pytest

from producer.gateway.auth import Principal
from producer.gateway.errors import ApiError
from producer.gateway.openai_requests import chat_request, completion_request
from producer.gateway.openai_schemas import ChatCompletionRequest, CompletionRequest

CALLER = Principal("acme", 100)


def _chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_sampling_fields_map_onto_sampling_params() -> None:
    req = chat_request(
        _chat(
            max_completion_tokens=7,
            max_tokens=3,
            temperature=0,
            stop="##",
            seed=4,
            logprobs=True,
            top_logprobs=3,
        ),
        CALLER,
    )
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.stop, s.seed, s.logprobs) == (7, 0.0, ("##",), 4, 3)
    assert req.metadata == {"tenant": "acme"}


def test_developer_role_and_text_parts_become_plain_messages() -> None:
    body = _chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    )
    messages = chat_request(body, CALLER).messages or ()
    assert [(m.role, m.content) for m in messages] == [("system", "be brief"), ("user", "ab")]


def test_a_one_item_prompt_list_is_a_prompt() -> None:
    body = CompletionRequest.model_validate({"model": "m", "prompt": ["go"], "logprobs": 2})
    req = completion_request(body, CALLER)
    assert (req.prompt, req.sampling.logprobs) == ("go", 2)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": "a", "best_of": 2}, "best_of"),
        ({"prompt": " "}, "prompt"),
        ({"prompt": "a", "max_tokens": 2, "min_tokens": 3}, "min_tokens"),
    ],
)
def test_what_cannot_be_served_is_named(fields: dict[str, object], param: str) -> None:
    body = CompletionRequest.model_validate({"model": "m", **fields})
    with pytest.raises(ApiError) as caught:
        completion_request(body, CALLER)
    assert caught.value.status == 400
    assert param in caught.value.detail.message
