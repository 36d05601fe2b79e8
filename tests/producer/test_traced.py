"""The clients' submit spans and the traceparent they carry (in-memory exporter)."""

from __future__ import annotations

import fakeredis
import orjson
import pytest
import redis
import redis.asyncio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from producer import AsyncClient, Client
from producer.embedded import EmbeddedRedis
from shared import tracing
from shared.errors import InvalidRequest
from shared.settings import DEFAULT_MODEL, Settings
from tests.conftest import as_tenant, serve
from tests.in_memory_spans import by_name, hex_ids, spans

__all__ = ["spans"]
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def client(fake_redis: fakeredis.FakeRedis) -> Client:
    serve(fake_redis, DEFAULT_MODEL)
    return Client(connection=fake_redis, settings=Settings())


def _recorded_traceparent(client: Client, request_id: str) -> str | None:
    payload = client.redis.hget(client.keys.request(request_id), "payload")
    value: str | None = orjson.loads(payload or b"{}").get("traceparent")
    return value


def test_a_submit_is_a_span_under_the_given_traceparent(
    client: Client, spans: InMemorySpanExporter
) -> None:
    handle = as_tenant(client, "t1").submit("hi", priority="high", traceparent=TRACEPARENT)
    submit = by_name(spans)["tokenq.submit"]
    trace_id, span_id, parent_id = hex_ids(submit)
    assert (trace_id, parent_id) == (TRACE_ID, PARENT_ID)
    # The worker's spans go under the submit span: its traceparent is the record's.
    assert _recorded_traceparent(client, handle.id) == f"00-{TRACE_ID}-{span_id}-01"
    attributes = dict(submit.attributes or {})
    assert attributes["tokenq.request.id"] == handle.id
    assert (attributes["tokenq.priority"], attributes["tokenq.tenant"]) == (75, "t1")


def test_without_a_traceparent_the_current_span_is_the_parent(
    client: Client, spans: InMemorySpanExporter
) -> None:
    tracer = tracing.tracer()
    assert tracer is not None
    with tracer.start_as_current_span("the application's") as outer:
        client.submit("hi")
    submit = by_name(spans)["tokenq.submit"]
    assert submit.parent is not None
    assert submit.parent.span_id == outer.get_span_context().span_id


def test_with_no_context_at_all_a_new_trace_starts(
    client: Client, spans: InMemorySpanExporter
) -> None:
    handle = client.submit("hi")
    trace_id, span_id, parent_id = hex_ids(by_name(spans)["tokenq.submit"])
    assert parent_id == ""
    recorded = _recorded_traceparent(client, handle.id) or ""
    assert recorded.startswith(f"00-{trace_id}-{span_id}-")


def test_with_tracing_off_the_given_traceparent_is_carried_as_it_is(client: Client) -> None:
    handle = client.submit("hi", traceparent=TRACEPARENT)
    assert _recorded_traceparent(client, handle.id) == TRACEPARENT


@pytest.mark.parametrize(
    "bad",
    [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # all-zero trace id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        f"{TRACEPARENT}-extra",  # version 00 has exactly four fields
    ],
)
def test_a_malformed_traceparent_is_refused_naming_the_field(client: Client, bad: str) -> None:
    with pytest.raises(InvalidRequest, match="traceparent"):
        client.submit("hi", traceparent=bad)


async def test_the_async_client_traces_its_submit_too(
    redis_server: EmbeddedRedis, spans: InMemorySpanExporter
) -> None:
    serve(redis.Redis.from_url(redis_server.url), "m")
    connection = redis.asyncio.Redis.from_url(redis_server.url)
    async with AsyncClient(connection=connection, settings=Settings()) as client:
        handle = await client.submit("hi", model="m", traceparent=TRACEPARENT)
        payload = await connection.hget(client.keys.request(handle.id), "payload")
    submit = by_name(spans)["tokenq.submit"]
    trace_id, span_id, parent_id = hex_ids(submit)
    assert (trace_id, parent_id) == (TRACE_ID, PARENT_ID)
    assert orjson.loads(payload or b"{}")["traceparent"] == f"00-{TRACE_ID}-{span_id}-01"
