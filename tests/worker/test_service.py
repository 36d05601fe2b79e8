"""The worker loop against fakeredis and a scripted engine: what clients see."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from producer.client import Client
from shared.keys import Keys, model_tag, new_request_id
from shared.models import FinalEvent, FinishReason, RequestState, TokenEvent
from shared.settings import Settings
from tests.worker.fakes import ScriptedEngine
from worker.service import WorkerService

MODEL = "m"


@pytest.fixture
def setup(fake_redis: fakeredis.FakeRedis) -> tuple[Client, WorkerService, ScriptedEngine]:
    settings = Settings()
    engine = ScriptedEngine()
    service = WorkerService(engine, fake_redis, settings, MODEL, "w1")  # type: ignore[arg-type]
    return Client(connection=fake_redis, settings=settings), service, engine


def test_claims_only_what_fits_then_drains_the_queue(setup: Any) -> None:
    client, service, engine = setup
    handles = [client.submit(f"p {i}", model=MODEL, max_tokens=3) for i in range(6)]
    assert service.intake() == 4
    assert [h.position() for h in handles[4:]] == [0, 1]
    service.run(burst=True)
    for h in handles:
        result = h.result(timeout=1)
        assert (result.text, result.finish_reason) == ("t0t1t2", FinishReason.LENGTH)
        indexes = [e.event.index for e in h.stream() if isinstance(e.event, TokenEvent)]
        assert indexes == [0, 1, 2]


def test_cancel_of_a_running_request_ends_its_stream_within_a_step(setup: Any) -> None:
    client, service, _ = setup
    h = client.submit("p", model=MODEL, max_tokens=50)
    service.intake()
    service.publish(service.engine.step())
    assert h.cancel() == "requested"
    service.publish(service.engine.step())  # publish sees the flag
    service.publish(service.engine.step())  # the engine ends it
    events = [e.event for e in h.stream()]
    assert isinstance(events[-1], FinalEvent)
    assert events[-1].finish_reason is FinishReason.CANCELLED
    assert h.status().state is RequestState.CANCELLED
    assert len(events) == 3


def test_unreadable_payload_fails_with_its_reason_and_the_worker_keeps_serving(
    setup: Any, fake_redis: fakeredis.FakeRedis
) -> None:
    client, service, _ = setup
    keys, tag = Keys(), model_tag(MODEL)
    bad = new_request_id(MODEL)
    fake_redis.hset(keys.request(bad), mapping={"payload": '{"model": "m", "prompt": 12', "state": "queued",
                                                "model": MODEL, "priority": 50})  # fmt: skip
    fake_redis.zadd(keys.queue(tag), {bad: 1})
    fake_redis.zadd(keys.queue(tag), {"not-a-valid-id": 2})
    good = client.submit("fine", model=MODEL, max_tokens=2)
    service.run(burst=True)
    result = client.handle(bad).result(timeout=1)
    assert result.finish_reason is FinishReason.ERROR
    assert result.error is not None and "unreadable payload" in result.error
    assert good.result(timeout=1).text == "t0t1"
    assert fake_redis.zcard(keys.queue(tag)) == 0


def test_a_prompt_the_engine_refuses_ends_with_a_clear_error(setup: Any) -> None:
    client, service, engine = setup
    engine.max_prompt_tokens = 3
    h = client.submit("one two three four five", model=MODEL)
    service.run(burst=True)
    result = h.result(timeout=1)
    assert result.finish_reason is FinishReason.ERROR
    assert "over the context" in (result.error or "")


def test_a_worker_that_lost_its_lease_publishes_nothing_more(
    setup: Any, fake_redis: fakeredis.FakeRedis
) -> None:
    client, service, engine = setup
    h = client.submit("p", model=MODEL, max_tokens=10)
    service.intake()
    service.publish(engine.step())
    fake_redis.hset(Keys().owners(model_tag(MODEL)), h.id, "w2:2")  # another worker took it
    service.publish(engine.step())
    service.run(burst=True)
    assert fake_redis.xlen(Keys().stream(h.id)) == 1
    assert h.status().state is RequestState.RUNNING
    assert h.id not in service.held
