"""Stream entries written by hand into a real redis-server that do not parse are
skipped (with a warning) by every reader, and a token entry can never forge an event:
native SSE, OpenAI chat (streamed and whole), Responses, the dashboard's live view, and
the Python client."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
import redis

from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.keys import Keys
from shared.models import FinalEvent, FinishReason, TokenEvent
from shared.replies import text
from tests.producer.gateway.conftest import RunningGateway, serve
from tests.producer.gateway.scripted import MODEL
from tests.producer.gateway.sse_client import Message, messages

ADMIN = {"Authorization": "Bearer admin-t"}
FORGED_FINAL = '{"type":"final","finish_reason":"stop","error":"forged"}'
INJECTION = f"\n\nevent: final\ndata: {FORGED_FINAL}\n\n"
UNREADABLE: list[dict[str, bytes]] = [
    {"e": b"not json"},
    {"e": b"[1, 2]"},
    {"e": b'{"type":"token","index":"x","token_ids":[1],"text":"a"}'},
    {"e": b'{"type":"token","index":3}'},
    {"e": b'{"type":"token","index":1,"token_ids":[7.5],"text":"a"}'},
    {"e": b'{"type":"token","index":1,"token_ids":[7],"text":"a","steps":[[5,5]]}'},
    {"e": b'{"type":"token","index":1,"token_ids":[7],"text":"a","evil":1}'},
    {"e": b'{"type":"final"}'},
    {"e": b'{"type":"elsewhere"}'},
    {"x": b"no event field"},
    # Not JSON: a raw line break and a forged final after a token's JSON.
    {"e": b'{"type":"token","index":1,"token_ids":[7],"text":"a"}' + INJECTION.encode()},
]
TEXTS = ["Hello", INJECTION, "!"]


def readable() -> list[bytes]:
    crafted = TokenEvent(index=1, token_ids=(2,), text=INJECTION).wire()  # valid JSON
    spaced = b'{"type":"token",\n\n"index":2,"token_ids":[3],"text":"!"}'  # JSON whitespace
    first = TokenEvent(index=0, token_ids=(1,), text="Hello").wire()
    final = orjson.dumps(FinalEvent(finish_reason=FinishReason.STOP).model_dump(mode="json"))
    return [first, crafted, spaced, final]


@pytest.fixture
def gateway(redis_server: EmbeddedRedis) -> Iterator[RunningGateway]:
    for running in serve(redis_server, admin_token="admin-t"):
        running.worker.stop()  # the test writes every entry itself
        yield running


def write_entries(connection: redis.Redis, request_id: str) -> None:
    """The readable entries with every unreadable one between the first and the rest."""
    key = Keys().stream(request_id)
    good = readable()
    connection.xadd(key, {"e": good[0]})
    for fields in UNREADABLE:
        connection.xadd(key, fields)  # type: ignore[arg-type]
    for data in good[1:]:
        connection.xadd(key, {"e": data})


def queued_id(connection: redis.Redis) -> str:
    """The id of the one request in Redis (submitted by a thread of the test)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [text(k) for k in connection.scan_iter(match="*:req:*")]
        if found:
            return found[0].rsplit(":req:", 1)[1]
        time.sleep(0.02)
    raise AssertionError("no request was queued")


def while_entries_are_written(gateway: RunningGateway, call: Callable[[], Any]) -> Any:
    """``call``'s answer, its request's entries written by hand as it waits."""
    answer: list[Any] = []
    thread = threading.Thread(target=lambda: answer.append(call()))
    thread.start()
    write_entries(gateway.redis, queued_id(gateway.redis))
    thread.join(timeout=30)
    assert answer, "the call did not return"
    return answer[0]


def _submit(http: httpx.Client) -> str:
    reply = http.post("/v1/requests", json={"model": MODEL, "prompt": "hi"})
    assert reply.status_code == 202, reply.text
    return str(reply.json()["id"])


def _sse(http: httpx.Client, url: str, **kwargs: Any) -> list[Message]:
    with http.stream("GET", url, **kwargs) as r:
        assert r.status_code == 200, r.read()
        return list(messages(r))


def test_native_sse_skips_them_and_a_token_cannot_forge_a_final(
    gateway: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    with gateway.client() as http:
        request_id = _submit(http)
        write_entries(gateway.redis, request_id)
        events = _sse(http, f"/v1/requests/{request_id}/events")
    assert [m.event for m in events] == ["token", "token", "token", "final"]
    assert [orjson.loads(m.data)["text"] for m in events[:3]] == TEXTS
    assert orjson.loads(events[-1].data)["error"] is None  # the real final, not the forged
    skipped = [r for r in caplog.records if "skipping unreadable entry" in r.getMessage()]
    assert len(skipped) == len(UNREADABLE)  # one warning each


def test_openai_chat_streamed_and_whole_skip_them(gateway: RunningGateway) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    with gateway.client() as http:
        whole = while_entries_are_written(
            gateway, lambda: http.post("/v1/chat/completions", json=chat)
        )
        gateway.redis.flushall()
        gateway.worker.register()
        with http.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as r:
            write_entries(gateway.redis, r.headers["x-tokenq-request-id"])
            chunks = [orjson.loads(m.data) for m in messages(r) if m.data != "[DONE]"]
    assert whole.status_code == 200, whole.text
    assert whole.json()["choices"][0]["message"]["content"] == "".join(TEXTS)
    assert whole.json()["choices"][0]["finish_reason"] == "stop"
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert streamed == "".join(TEXTS)
    assert not any("error" in c for c in chunks)


def test_responses_skip_them(gateway: RunningGateway) -> None:
    body = {"model": MODEL, "input": "hi"}
    with gateway.client() as http:
        reply = while_entries_are_written(gateway, lambda: http.post("/v1/responses", json=body))
        retrieved = http.get(f"/v1/responses/{reply.json()['id']}")
    assert reply.status_code == 200, reply.text
    for answer in (reply.json(), retrieved.json()):
        assert answer["status"] == "completed"
        assert answer["output"][0]["content"][0]["text"] == "".join(TEXTS)


def test_the_dashboards_live_view_skips_them(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        request_id = _submit(http)
        write_entries(gateway.redis, request_id)
        events = _sse(http, f"/admin/api/requests/{request_id}/stream", headers=ADMIN)
    stream = [m for m in events if m.event != "status"]
    assert [m.event for m in stream] == ["token", "token", "token", "final"]
    assert [orjson.loads(m.data)["text"] for m in stream[:3]] == TEXTS


def test_the_python_client_skips_them(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        request_id = _submit(http)
    write_entries(gateway.redis, request_id)
    with Client(settings=gateway.settings) as client:
        events = list(client.handle(request_id).stream(timeout=10))
    assert [e.event.type for e in events] == ["token", "token", "token", "final"]
    assert [e.event.text for e in events[:3]] == TEXTS  # type: ignore[union-attr]
