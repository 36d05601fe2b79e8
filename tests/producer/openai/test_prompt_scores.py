"""Echo and vLLM's prompt_logprobs from the worker's prompt scores: what each completions
body asks the worker for, and how the scores are shown."""

from __future__ import annotations

from typing import Any

import pytest

from producer.openai.prompt_scores import PromptView, echo_logprobs, spelled, vllm_scores
from producer.openai.requests import Origin, completion_request
from producer.openai.schemas import CompletionRequest

CALLER = Origin(50)
# "é" as two byte-level tokens: their texts are U+FFFD, their bytes join to the character.
SCORES: list[dict[str, Any]] = [
    {"token_id": 7, "token": "Caf", "logprob": None, "top": []},
    {"token_id": 8, "token": "\ufffd", "bytes": [0xC3], "logprob": -1.5, "rank": 2, "top": [
        {"token_id": 9, "token": "e", "logprob": -0.5},
        {"token_id": 8, "token": "\ufffd", "bytes": [0xC3], "logprob": -1.5},
    ]},
    {"token_id": 10, "token": "\ufffd", "bytes": [0xA9], "logprob": -0.1, "rank": 1, "top": [
        {"token_id": 10, "token": "\ufffd", "bytes": [0xA9], "logprob": -0.1},
        {"token_id": 11, "token": "!", "logprob": -3.0},
    ]},
]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "scored"),
    [
        ({"prompt": "a", "echo": True}, None),  # a text is echoed as given
        ({"prompt": "a", "echo": True, "logprobs": 2}, 2),
        ({"prompt": "a", "echo": True, "max_tokens": 0}, 0),
        ({"prompt": [1, 2], "echo": True}, 0),  # token ids are spelled from their scores
        ({"prompt": "a", "prompt_logprobs": 3, "echo": True, "logprobs": 1}, 3),
        ({"prompt": "a", "logprobs": 2}, None),
    ],
)
def test_the_worker_scores_the_prompt_only_where_needed(
    fields: dict[str, Any], scored: int | None
) -> None:
    body = CompletionRequest.model_validate({"model": "m", **fields})
    (req,) = completion_request(body, CALLER)
    assert req.sampling.prompt_logprobs == scored


def test_echo_spells_token_ids_and_nulls_the_first_logprob() -> None:
    assert spelled(SCORES) == "Café"
    logprobs = echo_logprobs(SCORES, 1)
    assert logprobs.tokens == ["Caf", "\ufffd", "\ufffd"]
    assert logprobs.token_logprobs == [None, -1.5, -0.1]
    assert logprobs.top_logprobs == [None, {"e": -0.5}, {"\ufffd": -0.1}]
    assert logprobs.text_offset == [0, 3, 4]
    assert PromptView(echo=True).echoed(SCORES) == "Café"
    assert PromptView(echo=True, text="as sent").echoed(SCORES) == "as sent"


def test_vllm_shape_has_the_token_and_its_top_alternatives() -> None:
    shown = vllm_scores(SCORES, 1)
    assert shown[0] is None
    assert {k: v.model_dump() for k, v in (shown[1] or {}).items()} == {
        "9": {"logprob": -0.5, "rank": 1, "decoded_token": "e"},
        "8": {"logprob": -1.5, "rank": 2, "decoded_token": "\ufffd"},
    }
    assert list(shown[2] or {}) == ["10"]  # the token is its own top one
