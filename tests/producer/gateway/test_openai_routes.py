"""The OpenAI-compatible routes, over HTTP against a real uvicorn and redis-server."""

from __future__ import annotations

import time

import httpx
import pytest

from producer.openai.responses import ChatCompletionChunk, Completion
from shared.keys import Keys
from shared.models import GenerationRequest
from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL, expected_text
from tests.producer.gateway.sse_client import messages

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def test_chat_completion_answers_the_whole_reply(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        reply = http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    body = reply.json()
    assert reply.status_code == 200
    assert body["choices"][0]["message"] == {"role": "assistant", "content": expected_text(3)}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert body["id"] == "chatcmpl-" + reply.headers["x-tokenq-request-id"]


def test_chat_stream_sends_role_deltas_finish_usage_then_done(gateway: RunningGateway) -> None:
    request = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with gateway.client() as http, http.stream("POST", "/v1/chat/completions", json=request) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [m.data for m in messages(r)]
    assert data[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(d) for d in data[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected_text(gateway.worker.num_tokens)
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == gateway.worker.num_tokens


def test_completion_stream_and_whole_agree(gateway: RunningGateway) -> None:
    request = {"model": MODEL, "prompt": "Once", "max_tokens": 5}
    with gateway.client() as http:
        whole = Completion.model_validate(http.post("/v1/completions", json=request).json())
        with http.stream("POST", "/v1/completions", json={**request, "stream": True}) as r:
            data = [m.data for m in messages(r)]
    streamed = [Completion.model_validate_json(d) for d in data[:-1]]
    assert whole.choices[0].text == "".join(c.choices[0].text for c in streamed) == expected_text(5)
    assert streamed[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "length"


def test_chat_logprobs_come_back_per_token(gateway: RunningGateway) -> None:
    request = {**CHAT, "max_tokens": 2, "logprobs": True, "top_logprobs": 2}
    with gateway.client() as http:
        body = http.post("/v1/chat/completions", json=request).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["t0 ", "t1 "]
    assert [len(c["top_logprobs"]) for c in content] == [2, 2]


@pytest.mark.parametrize(
    ("change", "param", "says"),
    [
        ({"n": 17}, "n", "from 1 to 16"),
        ({"temperature": -1}, "temperature", "greater than or equal to 0"),
        ({"stop": ["x"] * 17}, "stop", "at most 16"),
        ({"bogus": 1}, "bogus", "unknown field 'bogus'"),
        ({"messages": []}, "messages", "at least 1"),
        ({"priority": "urgent"}, "priority", "unknown priority 'urgent'"),
        ({"deadline": -5}, "deadline", "above 0"),
        ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
        ({"logit_bias": {"5": 101}}, "logit_bias.5", "less than or equal to 100"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}},
            "response_format.json_schema.schema",
            "'not' (at #) is not supported",
        ),
        ({"tool_choice": "required"}, "tool_choice", "'required' needs tools"),
    ],
)
def test_bad_input_answers_400_naming_the_field(
    gateway: RunningGateway, change: dict[str, object], param: str, says: str
) -> None:
    with gateway.client() as http:
        reply = http.post("/v1/chat/completions", json={**CHAT, **change})
    error = reply.json()["error"]
    assert reply.status_code == 400
    assert error["param"] == param and says in error["message"]
    assert error["type"] == "invalid_request_error"


def test_malformed_json_is_400_not_500(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        reply = http.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
    assert reply.status_code == 400
    assert "JSON" in reply.json()["error"]["message"]


def test_unknown_model_is_404(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        reply = http.post("/v1/chat/completions", json={**CHAT, "model": "nobody-serves-me"})
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "model_not_found"


def test_full_queue_is_429_with_retry_after(gateway: RunningGateway) -> None:
    gateway.worker.stop()
    with gateway.client() as http:
        for i in range(gateway.settings.max_queued):
            assert (
                http.post("/v1/requests", json={"model": MODEL, "prompt": f"p{i}"}).status_code
                == 202
            )
        reply = http.post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == 429
    assert int(reply.headers["retry-after"]) >= 1
    assert reply.json()["error"]["code"] == "queue_full"


def test_models_lists_what_live_workers_serve(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        listed = http.get("/v1/models").json()
        one = http.get(f"/v1/models/{MODEL}")
        missing = http.get("/v1/models/absent")
    assert [m["id"] for m in listed["data"]] == [MODEL]
    assert listed["data"][0]["num_workers"] == 1
    assert one.json()["id"] == MODEL and missing.status_code == 404


def test_a_dropped_stream_cancels_its_request(gateway: RunningGateway) -> None:
    gateway.worker.num_tokens = 10_000
    request = {**CHAT, "stream": True, "max_tokens": 10_000}
    with gateway.client() as http:
        with http.stream("POST", "/v1/chat/completions", json=request) as r:
            request_id = r.headers["x-tokenq-request-id"]
            for _, _message in zip(range(5), messages(r), strict=False):
                pass
        status = _wait_for_state(gateway, request_id, "cancelled")
    assert status["finish_reason"] == "cancelled"
    assert 4 <= int(str(status["num_generated"])) < 10_000


def test_a_client_that_gives_up_on_a_whole_reply_cancels_it(gateway: RunningGateway) -> None:
    gateway.worker.num_tokens = 10_000
    with gateway.client() as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 10_000}, timeout=0.3)
    (key,) = [str(k, "utf-8") for k in gateway.redis.scan_iter("tokenq:*:req:*")]
    request_id = key.rsplit(":", 1)[1]
    assert _wait_for_state(gateway, request_id, "cancelled")["finish_reason"] == "cancelled"


def _wait_for_state(gateway: RunningGateway, request_id: str, state: str) -> dict[str, object]:
    with gateway.client() as http:
        for _ in range(200):
            status: dict[str, object] = http.get(f"/v1/requests/{request_id}").json()
            if status["state"] == state:
                return status
            time.sleep(0.02)
    raise AssertionError(f"request {request_id} never reached {state}: {status}")


def test_tokenq_fields_ride_along_as_extra_body_fields(gateway: RunningGateway) -> None:
    extras = {
        "priority": "high",
        "deadline": 60,
        "idempotency_key": "k-1",
        "top_k": 5,
        "min_tokens": 1,
        "repetition_penalty": 1.1,
        "ignore_eos": True,
        "user": "u7",
    }
    with gateway.client() as http:
        first = http.post("/v1/chat/completions", json={**CHAT, **extras})
        again = http.post("/v1/chat/completions", json={**CHAT, **extras})
    request_id = first.headers["x-tokenq-request-id"]
    assert again.headers["x-tokenq-request-id"] == request_id
    assert again.json()["choices"] == first.json()["choices"]
    stored = GenerationRequest.model_validate_json(
        gateway.redis.hget(Keys().request(request_id), "payload") or b""
    )
    assert stored.priority == 75 and stored.deadline_ms is not None
    assert (stored.sampling.top_k, stored.sampling.ignore_eos) == (5, True)
    assert (stored.metadata, stored.tenant) == ({"user": "u7"}, "default")
