"""Several gateway processes on one Redis (and on one Redis Cluster): they share every
request, so a native stream whose gateway is killed resumes on another with
Last-Event-ID, and any gateway reads or cancels a request submitted on another."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest

from shared.settings import Settings
from tests.integration.conftest import TokenqRedis
from tests.producer.gateway.process import gateway_process, started_gateway
from tests.producer.gateway.scripted import MODEL, ScriptedWorker, expected_text
from tests.producer.gateway.sse_client import Message, messages

pytestmark = pytest.mark.integration
NUM_TOKENS = 60
READ_BEFORE_KILL = 10


@pytest.fixture
def worker(any_real_redis: TokenqRedis) -> Iterator[ScriptedWorker]:
    url = any_real_redis.url
    w = ScriptedWorker(url, Settings(redis_url=url), step_s=0.02, num_tokens=NUM_TOKENS).start()
    yield w
    w.stop()


def _submit(http: httpx.Client, max_tokens: int) -> str:
    body = {"model": MODEL, "prompt": "hi", "sampling": {"max_tokens": max_tokens}}
    reply = http.post("/v1/requests", json=body)
    assert reply.status_code == 202, reply.text
    return str(reply.json()["id"])


def _text(events: list[Message]) -> str:
    return "".join(orjson.loads(m.data).get("text", "") for m in events if m.event == "token")


def _read_until_killed(
    http: httpx.Client, request_id: str, kill: Callable[[], None]
) -> list[Message]:
    """Events read from a stream until its gateway dies under it (``kill`` is called
    after READ_BEFORE_KILL of them)."""
    seen: list[Message] = []
    try:
        with http.stream("GET", f"/v1/requests/{request_id}/events") as r:
            for message in messages(r):
                seen.append(message)
                if len(seen) == READ_BEFORE_KILL:
                    kill()
    except httpx.HTTPError:
        pass  # the connection died with the gateway: what a client sees
    return seen


def test_a_stream_resumes_on_another_gateway_after_its_gateway_is_killed(
    any_real_redis: TokenqRedis, worker: ScriptedWorker
) -> None:
    with (
        started_gateway(any_real_redis.url) as (a_url, a_proc),
        gateway_process(any_real_redis.url) as b_url,
        httpx.Client(base_url=a_url, timeout=10) as a,
        httpx.Client(base_url=b_url, timeout=10) as b,
    ):
        request_id = _submit(a, NUM_TOKENS)
        first = _read_until_killed(a, request_id, a_proc.kill)
        assert a_proc.wait(timeout=10) != 0  # SIGKILLed mid-stream
        assert READ_BEFORE_KILL <= len(first) < NUM_TOKENS  # cut off part way
        assert first[-1].event == "token"
        headers = {"Last-Event-ID": first[-1].id or ""}
        with b.stream("GET", f"/v1/requests/{request_id}/events", headers=headers) as r:
            rest = list(messages(r))
        view = b.get(f"/v1/requests/{request_id}").json()
    ids = [m.id for m in first + rest]
    assert len(ids) == len(set(ids)) == NUM_TOKENS + 1  # no gap, no duplicate
    assert _text(first) + _text(rest) == expected_text(NUM_TOKENS) == view["result"]["text"]
    assert (rest[-1].event, view["state"]) == ("final", "finished")


def test_a_request_submitted_on_one_gateway_is_read_and_cancelled_on_another(
    any_real_redis: TokenqRedis, worker: ScriptedWorker
) -> None:
    worker.num_tokens = 100_000
    with (
        gateway_process(any_real_redis.url) as a_url,
        gateway_process(any_real_redis.url) as b_url,
        httpx.Client(base_url=a_url, timeout=10) as a,
        httpx.Client(base_url=b_url, timeout=10) as b,
    ):
        request_id = _submit(a, 100_000)
        deadline = time.monotonic() + 10
        while b.get(f"/v1/requests/{request_id}").json()["state"] != "running":
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.02)
        assert b.delete(f"/v1/requests/{request_id}").json()["outcome"] == "requested"
        with a.stream("GET", f"/v1/requests/{request_id}/events") as r:
            final = [m for m in messages(r) if m.event == "final"]
    assert orjson.loads(final[0].data)["finish_reason"] == "cancelled"
