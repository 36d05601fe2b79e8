"""Native routes: submit with a priority, status and position, resumable events, cancel."""

from __future__ import annotations

import time

import httpx
import orjson

from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL, expected_text
from tests.producer.gateway.sse_client import Message, messages

UNKNOWN_ID = "0123abcd-" + "0" * 24


def _submit(http: httpx.Client, **fields: object) -> dict[str, object]:
    reply = http.post("/v1/requests", json={"model": MODEL, "prompt": "hi", **fields})
    assert reply.status_code in (200, 202), reply.text
    body: dict[str, object] = reply.json()
    return body


def _events(http: httpx.Client, request_id: str, **kwargs: object) -> list[Message]:
    with http.stream("GET", f"/v1/requests/{request_id}/events", **kwargs) as r:  # type: ignore[arg-type]
        return list(messages(r))


def _text(events: list[Message]) -> str:
    return "".join(orjson.loads(m.data).get("text", "") for m in events if m.event == "token")


def test_submit_answers_202_with_id_and_queue_position(gateway: RunningGateway) -> None:
    gateway.worker.stop()
    with gateway.client() as http:
        low = _submit(http, priority="low")
        high = _submit(http, priority="high")
        status = http.get(f"/v1/requests/{low['id']}").json()
    assert (low["state"], low["position"], high["position"]) == ("queued", 0, 0)
    assert (status["position"], status["priority"], status["result"]) == (1, 25, None)


def test_a_repeated_idempotency_key_answers_200_with_the_first_id(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        first = http.post(
            "/v1/requests", json={"model": MODEL, "prompt": "a", "idempotency_key": "x"}
        )
        again = http.post(
            "/v1/requests", json={"model": MODEL, "prompt": "a", "idempotency_key": "x"}
        )
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"] and again.json()["duplicate"] is True


def test_events_stream_tokens_then_final_and_the_result_is_kept(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        request_id = str(_submit(http, sampling={"max_tokens": 4})["id"])
        events = _events(http, request_id)
        view = http.get(f"/v1/requests/{request_id}").json()
    assert [m.event for m in events] == ["token"] * 4 + ["final"]
    assert all(m.id and m.id.count("-") == 1 for m in events)
    assert _text(events) == expected_text(4) == view["result"]["text"]
    assert (view["state"], view["result"]["finish_reason"]) == ("finished", "length")


def test_resuming_with_last_event_id_joins_to_the_uninterrupted_stream(
    gateway: RunningGateway,
) -> None:
    gateway.worker.num_tokens = 40
    with gateway.client() as http:
        request_id = str(_submit(http, sampling={"max_tokens": 40})["id"])
        url = f"/v1/requests/{request_id}/events"
        with http.stream("GET", url) as r:  # drop the connection after 7 events
            first = [m for _, m in zip(range(7), messages(r), strict=False)]
        last_id = first[-1].id or ""
        rest = _events(http, request_id, headers={"Last-Event-ID": last_id})
        by_query = _events(http, request_id, params={"after": last_id})
        whole = _events(http, request_id)
        status = http.get(f"/v1/requests/{request_id}").json()
    assert status["state"] == "finished"  # a native disconnect does not cancel
    assert _text(first) + _text(rest) == _text(whole) == expected_text(40)
    assert (
        [m.id for m in first + rest]
        == [m.id for m in whole]
        == [m.id for m in first] + [m.id for m in by_query]
    )


def test_coalesced_entries_are_one_event_each_and_resume_after_the_whole_entry(
    gateway: RunningGateway,
) -> None:
    gateway.worker.num_tokens, gateway.worker.tokens_per_entry = 40, 3
    with gateway.client() as http:
        request_id = str(_submit(http, sampling={"max_tokens": 40})["id"])
        url = f"/v1/requests/{request_id}/events"
        with http.stream("GET", url) as r:  # drop the connection after 5 entries
            first = [m for _, m in zip(range(5), messages(r), strict=False)]
        rest = _events(http, request_id, headers={"Last-Event-ID": first[-1].id or ""})
    tokens = [orjson.loads(m.data) for m in first + rest if m.event == "token"]
    assert [t["index"] for t in tokens] == list(range(0, 40, 3))
    assert [len(t["token_ids"]) for t in tokens] == [3] * 13 + [1]
    assert _text(first) + _text(rest) == expected_text(40)
    assert [m.event for m in rest][-1] == "final"


def test_cancel_a_queued_request_at_once_and_a_running_one_soon(gateway: RunningGateway) -> None:
    gateway.worker.num_tokens = 10_000
    with gateway.client() as http:
        running = str(_submit(http, sampling={"max_tokens": 10_000})["id"])
        _wait(lambda: http.get(f"/v1/requests/{running}").json()["state"] == "running")
        gateway.worker.stop()
        queued = str(_submit(http)["id"])
        assert http.delete(f"/v1/requests/{queued}").json() == {
            "id": queued,
            "outcome": "cancelled",
        }
        assert http.delete(f"/v1/requests/{running}").json()["outcome"] == "requested"
        view = http.get(f"/v1/requests/{queued}").json()
    assert (view["state"], view["result"]["finish_reason"]) == ("cancelled", "cancelled")


def test_unknown_and_malformed_ids(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        for method, suffix in (("GET", ""), ("DELETE", ""), ("GET", "/events")):
            unknown = http.request(method, f"/v1/requests/{UNKNOWN_ID}{suffix}")
            malformed = http.request(method, f"/v1/requests/not-an-id{suffix}")
            assert unknown.status_code == 404, (method, suffix)
            assert malformed.status_code == 400 and malformed.json()["error"]["param"]
        bad_cursor = http.get(f"/v1/requests/{UNKNOWN_ID}/events", headers={"Last-Event-ID": "x"})
    assert bad_cursor.status_code == 400
    assert bad_cursor.json()["error"]["param"] == "header.Last-Event-ID"


def test_bad_sampling_is_400_naming_the_field(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        reply = http.post(
            "/v1/requests", json={"model": MODEL, "prompt": "x", "sampling": {"max_tokens": 0}}
        )
        both = http.post(
            "/v1/requests", json={"prompt": "x", "messages": [{"role": "user", "content": "y"}]}
        )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "sampling.max_tokens"
    assert (
        both.status_code == 400
        and "exactly one of prompt, prompt_token_ids and messages" in both.text
    )


def _wait(done: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(done) and done():
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def _timed_events(http: httpx.Client, request_id: str, cursor: str) -> tuple[list[Message], float]:
    started = time.monotonic()
    events = _events(http, request_id, headers={"Last-Event-ID": cursor})
    return events, time.monotonic() - started


def test_resuming_at_or_past_the_final_event_returns_it_at_once(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        request_id = str(_submit(http, sampling={"max_tokens": 3})["id"])
        final = _events(http, request_id)[-1]
        at_final, at_s = _timed_events(http, request_id, final.id or "")
        past, past_s = _timed_events(http, request_id, "99999999999999-0")
    assert final.event == "final"
    for events in (at_final, past):
        assert [(m.event, m.id, m.data) for m in events] == [("final", final.id, final.data)]
    assert max(at_s, past_s) < 2.0  # not keep-alives until the request expires


def test_a_cursor_ahead_of_the_stream_still_gets_what_comes_next(gateway: RunningGateway) -> None:
    gateway.worker.stop()
    with gateway.client() as http:
        request_id = str(_submit(http, sampling={"max_tokens": 3})["id"])
        url, ahead = f"/v1/requests/{request_id}/events", {"Last-Event-ID": "99999999999999-0"}
        with http.stream("GET", url, headers=ahead) as r:
            # Started once the gateway answers, so no token is in the stream when it
            # looks for where to read from (else it reads on after that token).
            gateway.worker.start()
            events = list(messages(r))
    assert [m.event for m in events] == ["token"] * 3 + ["final"]
    assert _text(events) == expected_text(3)
