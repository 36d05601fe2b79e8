"""``/v1/responses`` over HTTP (a real uvicorn, redis-server and the unmodified ``openai``
package), a scripted worker answering ``t0 t1 ...``: create, stream, background,
retrieve, resume, cancel, delete, input items, and the refusals."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from producer.embedded import EmbeddedRedis
from shared.keys import Keys
from tests.producer.gateway.conftest import RunningGateway, serve
from tests.producer.gateway.scripted import MODEL, ScriptedWorker, expected_text
from tests.producer.gateway.sse_client import messages


@pytest.fixture
def client(gateway: RunningGateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0) as c:
        yield c


def wait_for(
    client: openai.OpenAI, response_id: str, statuses: tuple[str, ...], timeout_s: float = 10.0
) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = client.responses.retrieve(response_id)
        if response.status in statuses:
            return response
        time.sleep(0.02)
    raise AssertionError(f"{response_id} never reached {statuses}")


def test_create_answers_the_whole_response(client: openai.OpenAI, gateway: RunningGateway) -> None:
    response = client.responses.create(model=MODEL, input="hi", max_output_tokens=5)
    assert response.id.startswith("resp_")
    assert response.status == "incomplete"  # cut at max_output_tokens
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == expected_text(5)
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 5)
    (request,) = gateway.worker.claimed
    assert [(m.role, m.content) for m in request.messages or ()] == [("user", "hi")]
    assert request.sampling.max_tokens == 5
    assert client.responses.retrieve(response.id).model_dump() == response.model_dump()


def test_instructions_go_first_as_a_system_message(
    client: openai.OpenAI, gateway: RunningGateway
) -> None:
    ask: Any = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    response = client.responses.create(model=MODEL, input=ask, instructions="Be brief.")
    assert response.status == "completed"
    assert response.output_text == expected_text(gateway.worker.num_tokens)
    (request,) = gateway.worker.claimed
    roles = [(m.role, m.content) for m in request.messages or ()]
    assert roles == [("system", "Be brief."), ("user", "hi")]


def test_a_stream_numbers_every_event_and_ends_with_the_response(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="hi", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == expected_text(8)
    last = events[-1]
    assert last.type == "response.completed"
    assert last.response.output_text == deltas
    assert client.responses.retrieve(last.response.id).model_dump() == last.response.model_dump()


def test_background_answers_queued_then_completes(
    client: openai.OpenAI, gateway: RunningGateway
) -> None:
    gateway.worker.stop()  # nothing runs it yet
    response = client.responses.create(model=MODEL, input="hi", background=True)
    assert (response.status, response.background, response.output) == ("queued", True, [])
    assert client.responses.retrieve(response.id).status == "queued"
    worker = ScriptedWorker(gateway.settings.redis_url, gateway.settings, worker_id="late").start()
    try:
        done = wait_for(client, response.id, ("completed",))
    finally:
        worker.stop()
    assert done.output_text == expected_text(8)


def test_cancel_ends_a_queued_response_at_once(
    client: openai.OpenAI, gateway: RunningGateway
) -> None:
    gateway.worker.stop()
    response = client.responses.create(model=MODEL, input="hi", background=True)
    cancelled = client.responses.cancel(response.id)
    assert (cancelled.status, cancelled.output) == ("cancelled", [])
    assert client.responses.retrieve(response.id).status == "cancelled"
    events = list(client.responses.retrieve(response.id, stream=True))
    assert [e.type for e in events] == ["response.created", "response.queued", "response.cancelled"]


def test_cancel_stops_a_running_response(client: openai.OpenAI, gateway: RunningGateway) -> None:
    gateway.worker.num_tokens, gateway.worker.step_s = 10_000, 0.02
    response = client.responses.create(
        model=MODEL, input="hi", background=True, max_output_tokens=10_000
    )
    running = wait_for(client, response.id, ("in_progress",))
    assert running.status == "in_progress"
    cancelled = client.responses.cancel(response.id)
    assert cancelled.status == "cancelled"
    assert 0 < len(cancelled.output_text) < len(expected_text(10_000))
    assert client.responses.retrieve(response.id).status == "cancelled"


def test_a_dropped_stream_resumes_after_the_last_event_seen(
    client: openai.OpenAI, gateway: RunningGateway
) -> None:
    gateway.worker.step_s = 0.02
    stream = client.responses.create(model=MODEL, input="hi", background=True, stream=True)
    seen = []
    for event in stream:
        seen.append(event)
        if len(seen) == 6:
            break
    stream.close()  # the connection drops mid-answer: a background response runs on
    response_id = seen[0].response.id  # type: ignore[union-attr]
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=5))
    whole = list(client.responses.retrieve(response_id, stream=True))
    assert [e.model_dump() for e in seen + rest] == [e.model_dump() for e in whole]
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    assert whole[-1].type == "response.completed"


def test_a_dropped_foreground_stream_cancels_its_request(gateway: RunningGateway) -> None:
    gateway.worker.num_tokens, gateway.worker.step_s = 10_000, 0.02
    body = {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 10_000}
    with gateway.client() as http, http.stream("POST", "/v1/responses", json=body) as r:
        request_id = r.headers["x-tokenq-request-id"]
        for n, _ in enumerate(messages(r)):
            if n == 5:
                break
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = gateway.redis.hget(Keys().request(request_id), "state")
        if state == b"cancelled":
            return
        time.sleep(0.05)
    raise AssertionError("the request was not cancelled")


def test_store_false_is_not_kept(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="hi", store=False)
    assert response.status == "completed"
    with pytest.raises(openai.NotFoundError, match="store: false"):
        client.responses.retrieve(response.id)


def test_delete_removes_the_response(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="hi")
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_input_items_list_this_responses_inputs(client: openai.OpenAI) -> None:
    ask: Any = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "three"}]},
    ]
    response = client.responses.create(model=MODEL, input=ask)

    def texts(page: Any) -> list[str]:
        return [item.content[0].text for item in page.data]

    assert texts(client.responses.input_items.list(response.id)) == ["three", "two", "one"]
    page = client.responses.input_items.list(response.id, order="asc", limit=2)
    assert texts(page) == ["one", "two"]
    assert page.has_more
    after = client.responses.input_items.list(response.id, order="asc", after=page.data[-1].id)
    assert texts(after) == ["three"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0.type",
            "input_image parts are not supported",
        ),
        ({"input": "hi", "truncation": "auto"}, "truncation", "does not truncate"),
        ({"input": "hi", "background": True, "store": False}, "background", "store: true"),
        ({"input": "hi", "frobnicate": 1}, "frobnicate", "unknown field"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type", "send the item"),
        (
            {"input": "hi", "tools": [{"type": "web_search"}]},
            "tools",
            "function tools only",
        ),
    ],
)
def test_what_cannot_be_served_is_refused_naming_it(
    gateway: RunningGateway, body: dict[str, Any], param: str, words: str
) -> None:
    with gateway.client() as http:
        reply = http.post("/v1/responses", json={"model": MODEL, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"].startswith(param)
    assert words in error["message"]
    assert gateway.worker.claimed == []


def test_an_unknown_or_malformed_id_answers_404_or_400(gateway: RunningGateway) -> None:
    missing = "resp_00000000-00000000000000000000000f"
    with gateway.client() as http:
        assert http.get(f"/v1/responses/{missing}").status_code == 404
        assert http.get("/v1/responses/nonsense").status_code == 400
        follow = {"model": MODEL, "input": "hi", "previous_response_id": missing}
        reply = http.post("/v1/responses", json=follow)
    assert reply.status_code == 404
    assert reply.json()["error"]["param"] == "previous_response_id"


def test_cancel_refuses_a_foreground_response(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.BadRequestError, match="background: true"):
        client.responses.cancel(response.id)


def test_another_tenants_response_is_not_found(keyed_gateway: RunningGateway) -> None:
    headers = {"Authorization": "Bearer sk-web"}
    other = {"Authorization": "Bearer sk-ops"}
    with httpx.Client(base_url=keyed_gateway.url, timeout=10) as http:
        made = http.post("/v1/responses", json={"model": MODEL, "input": "hi"}, headers=headers)
        response_id = made.json()["id"]
        assert http.get(f"/v1/responses/{response_id}", headers=headers).status_code == 200
        assert http.get(f"/v1/responses/{response_id}", headers=other).status_code == 404
        assert http.delete(f"/v1/responses/{response_id}", headers=other).status_code == 404
        follow = {"model": MODEL, "input": "more", "previous_response_id": response_id}
        assert http.post("/v1/responses", json=follow, headers=other).status_code == 404


def test_the_dashboard_shows_a_response_as_a_request(redis_server: EmbeddedRedis) -> None:
    for gateway in serve(redis_server, admin_token="secret"):
        admin = {"Authorization": "Bearer secret"}
        with gateway.client() as http:
            made = http.post("/v1/responses", json={"model": MODEL, "input": "hi"}).json()
            request_id = made["id"].removeprefix("resp_")
            recent = http.get("/admin/api/requests?kind=recent", headers=admin).json()
            detail = http.get(f"/admin/api/requests/{request_id}", headers=admin).json()
        assert request_id in [row["id"] for row in recent]
        assert detail["state"] == "finished"
        assert [(m["role"], m["content"]) for m in detail["messages"]] == [("user", "hi")]


def test_a_keys_rate_limit_and_weight_hold_for_responses(redis_server: EmbeddedRedis) -> None:
    keys = '{"sk-a": {"tenant": "acme", "weight": 3, "requests_per_min": 1}}'
    for gateway in serve(redis_server, keys):
        headers = {"Authorization": "Bearer sk-a"}
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 2}
        with gateway.client() as http:
            first = http.post("/v1/responses", json=body, headers=headers)
            second = http.post("/v1/responses", json=body, headers=headers)
        assert first.status_code == 200
        assert first.headers["x-ratelimit-remaining-requests"] == "0"
        assert second.status_code == 429 and "Retry-After" in second.headers
        (request,) = gateway.worker.claimed
        assert (request.tenant, request.tenant_weight) == ("acme", 3.0)
