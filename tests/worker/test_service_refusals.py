"""A request the worker refuses ends with its refusal as data in Redis: the client's
Result and the stream's final event carry the code and the field, read back through
the publish script (fakeredis, a scripted engine)."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from producer.client import Client
from shared.models import FinalEvent, FinishReason
from shared.refusal import RefusalCode
from shared.settings import Settings
from tests.conftest import serve
from tests.worker.fakes import ScriptedEngine, lockstep
from worker.service import WorkerService

MODEL = "m"


@pytest.fixture
def setup(fake_redis: fakeredis.FakeRedis) -> tuple[Client, WorkerService, ScriptedEngine]:
    settings = Settings(publish_coalesce_ms=0)
    serve(fake_redis, MODEL)
    engine = ScriptedEngine()
    service = lockstep(WorkerService(engine, fake_redis, settings, MODEL, "w1"))
    return Client(connection=fake_redis, settings=settings), service, engine


def test_a_refused_request_ends_with_its_refusal_as_data(setup: Any) -> None:
    client, service, engine = setup
    bad = client.submit(prompt_token_ids=[5, engine.vocab_size], model=MODEL, max_tokens=2)
    service.run(burst=True)
    result = bad.result(timeout=1)
    assert result.finish_reason is FinishReason.ERROR
    assert result.refusal is not None
    assert (result.refusal.code, result.refusal.param) == (
        RefusalCode.INVALID_VALUE,
        "prompt_token_ids",
    )
    assert result.error == f"cannot run this request: {result.refusal.message}"
    [final] = [e.event for e in bad.stream(timeout=1) if isinstance(e.event, FinalEvent)]
    assert final.refusal == result.refusal


def test_the_services_own_failure_carries_no_refusal(setup: Any) -> None:
    client, service, engine = setup
    h = client.submit("p", model=MODEL, max_tokens=5)
    service.iterate()
    engine.failing[h.id] = "internal error: the step failed"
    service.run(burst=True)
    result = h.result(timeout=1)
    assert result.finish_reason is FinishReason.ERROR and result.refusal is None
