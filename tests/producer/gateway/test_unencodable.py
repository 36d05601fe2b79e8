"""What JSON cannot carry to a worker (an integer past 64 bits, nesting past orjson's
255 levels) is the client's mistake: 400 on every route, never a 500 that closes the
connection. (A bound on the field in ``shared.models`` may refuse it first.)"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from producer.gateway.errors import map_tokenq_error
from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL

HI = [{"role": "user", "content": "hi"}]


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/requests", {"model": MODEL, "prompt": "x", "sampling": {"guided_json": _deep(300)}}),
        ("/v1/chat/completions", {"model": MODEL, "messages": HI, "guided_json": _deep(300)}),
        ("/v1/chat/completions", {"model": MODEL, "messages": HI, "top_k": 2**70}),
        ("/v1/completions", {"model": MODEL, "prompt": [[2**70]]}),
    ],
    ids=["native-schema", "chat-schema", "chat-top-k", "completion-token-id"],
)
def test_an_unencodable_value_is_a_400(
    gateway: RunningGateway, path: str, body: dict[str, Any]
) -> None:
    with gateway.client() as http:
        refused = http.post(path, json=body)
        after = http.get("/healthz")  # the same connection serves on
    assert refused.status_code == 400, refused.text
    # A bound on the field (shared.models) may refuse it first; either way a 400.
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert after.status_code == 200


def test_the_400_says_what_json_cannot_carry() -> None:
    with pytest.raises(orjson.JSONEncodeError) as caught:
        orjson.dumps(2**70)
    error = map_tokenq_error(caught.value)
    assert (error.status, error.detail.code) == (400, "unencodable_value")
    assert "integers must fit in 64 bits" in error.detail.message
