"""The dashboard's live view of one request, resumed at or past its final event, ends at
once instead of polling until the connection's limit."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from producer.embedded import EmbeddedRedis
from tests.producer.gateway.conftest import RunningGateway, serve
from tests.producer.gateway.scripted import MODEL
from tests.producer.gateway.sse_client import messages

ADMIN = {"Authorization": "Bearer admin-t"}


@pytest.fixture
def gateway(redis_server: EmbeddedRedis) -> Iterator[RunningGateway]:
    yield from serve(redis_server, admin_token="admin-t")


def test_resuming_past_the_final_event_ends_the_stream(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        body = {"model": MODEL, "prompt": "hi", "sampling": {"max_tokens": 3}}
        request_id = http.post("/v1/requests", json=body).json()["id"]
        url = f"/admin/api/requests/{request_id}/stream"
        with http.stream("GET", url, headers=ADMIN) as r:
            whole = list(messages(r))
        final_id = next(m.id for m in whole if m.event == "final")
        started = time.monotonic()
        with http.stream("GET", url, headers={**ADMIN, "Last-Event-ID": final_id or ""}) as r:
            resumed = list(messages(r))
        elapsed_s = time.monotonic() - started
    assert [m.event for m in whole if m.event != "status"] == ["token"] * 3 + ["final"]
    assert {m.event for m in resumed} == {"status"}
    assert '"finished"' in resumed[-1].data
    assert elapsed_s < 5.0
