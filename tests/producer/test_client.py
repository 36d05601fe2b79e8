"""The sync client: submit, validation, status and results as a user sees them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis

from producer.client import Client
from shared.errors import InvalidRequest, NotFound, RequestTimeout, UnknownModel
from shared.keys import Keys, model_tag
from shared.models import RequestState
from shared.settings import DEFAULT_MODEL, Settings

QUEUE = Keys().queue(model_tag(DEFAULT_MODEL))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": "hi", "priority": "urgent"}, "unknown priority 'urgent'"),
        ({"prompt": "hi", "priority": 500}, "out of range"),
        ({"prompt": "hi", "max_tokens": -5}, "sampling.max_tokens: Input should be greater"),
        ({"prompt": ""}, "prompt: String should have at least 1 character"),
        ({"prompt": "   "}, "prompt must not be blank"),
        ({"prompt": "hi", "temprature": 0.5}, "sampling.temprature: unknown field 'temprature'"),
        ({"prompt": "hi", "top_p": 0}, "sampling.top_p"),
        ({"prompt": "hi", "min_tokens": 9, "max_tokens": 2}, "must not exceed max_tokens"),
        ({"prompt": "x" * 1001}, "over the limit of 1000"),
        ({}, "give exactly one of prompt, prompt_token_ids and messages"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "exactly one"),
        ({"messages": [{"role": "robot", "content": "b"}]}, "messages.0.role"),
        ({"prompt": "hi", "model": "bad model name!"}, "model: String should match"),
        ({"prompt": "hi", "deadline": -1}, "deadline: must be a positive"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error_and_nothing_is_enqueued(
    any_redis: redis.Redis, make_settings: object, kwargs: dict[str, object], message: str
) -> None:
    client = Client(connection=any_redis, settings=make_settings(max_prompt_chars=1000))  # type: ignore[operator]
    with pytest.raises(InvalidRequest) as info:
        client.submit(**kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)
    assert any_redis.zcard(QUEUE) == 0
    assert any_redis.dbsize() == 0


def test_submit_many_is_one_batch_and_keeps_order(client: Client) -> None:
    reqs = [{"model": DEFAULT_MODEL, "prompt": f"p{i}", "priority": "normal"} for i in range(5)]
    handles = client.submit_many(reqs)
    assert [h.position() for h in handles] == [0, 1, 2, 3, 4]


def test_submit_many_validates_all_before_enqueuing_any(client: Client) -> None:
    reqs = [{"model": DEFAULT_MODEL, "prompt": "ok"}, {"model": DEFAULT_MODEL, "prompt": ""}]
    with pytest.raises(InvalidRequest, match=r"prompt"):
        client.submit_many(reqs)
    assert client.redis.zcard(QUEUE) == 0


def test_status_of_a_new_request(client: Client) -> None:
    h = client.submit("hi", priority="high", metadata={"user": "u1"})
    status = h.status()
    assert (status.state, status.priority, status.position, status.attempts) == (
        RequestState.QUEUED,
        75,
        0,
        0,
    )


def test_unknown_and_malformed_ids(client: Client) -> None:
    with pytest.raises(InvalidRequest, match="malformed request id"):
        client.handle("../etc/passwd")
    ghost = client.handle(f"{model_tag(DEFAULT_MODEL)}-{'0' * 24}")
    with pytest.raises(NotFound, match="does not exist"):
        ghost.status()
    with pytest.raises(NotFound):
        ghost.cancel()


def test_a_model_no_worker_serves_is_refused(any_redis: redis.Redis) -> None:
    client = Client(connection=any_redis, settings=Settings())
    with pytest.raises(UnknownModel, match="not served by any worker: start one with"):
        client.submit("hi", model="nobody-serves-this")
    assert any_redis.dbsize() == 0
    lenient = Client(connection=any_redis, settings=Settings(require_known_model=False))
    assert lenient.submit("hi", model="nobody-serves-this").position() == 0


def test_stream_and_result_give_up_after_their_timeout(client: Client) -> None:
    h = client.submit("nobody runs this")
    with pytest.raises(RequestTimeout, match=r"did not finish within 0\.2s"):
        list(h.stream(timeout=0.2))
    with pytest.raises(RequestTimeout):
        h.result(timeout=0.2)


def test_the_client_loads_without_the_gateway_or_worker_extras() -> None:
    """`pip install tokenq` (no extra) is enough for the clients: neither the web stack
    nor torch is loaded by them."""
    heavy = ("fastapi", "starlette", "uvicorn", "torch", "transformers")
    code = (
        "import sys, producer, producer.client, producer.aio; "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
