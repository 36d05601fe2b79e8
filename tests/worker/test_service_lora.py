"""The worker loop hands the engine each request's adapter as registered when it is
claimed; one unregistered since its submit ends with an error saying so."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from producer.client import Client
from shared.keys import Keys
from shared.loras import new_adapter, register_lora, remove_lora
from shared.models import FinishReason, RequestState
from shared.settings import Settings
from tests.conftest import serve
from tests.worker.fakes import ScriptedEngine
from worker.engine.request import LoraRef
from worker.service import WorkerService

MODEL = "m"


@pytest.fixture
def setup(fake_redis: fakeredis.FakeRedis) -> tuple[Client, WorkerService, ScriptedEngine]:
    settings = Settings()
    serve(fake_redis, MODEL)
    register_lora(fake_redis, Keys(), new_adapter(MODEL, "poet", "/adapters/poet", rank=8))
    engine = ScriptedEngine()
    service = WorkerService(engine, fake_redis, settings, MODEL, "w1")
    return Client(connection=fake_redis, settings=settings), service, engine


def test_the_engine_gets_the_adapter_s_registered_path(setup: Any) -> None:
    client, service, engine = setup
    with_lora = client.submit("p", model=MODEL, lora="poet", max_tokens=2)
    plain = client.submit("p", model=MODEL, max_tokens=2)
    service.intake()
    assert engine.running[with_lora.id].lora == LoraRef("poet", "/adapters/poet")
    assert engine.running[plain.id].lora is None
    assert engine.resident_loras() == ["poet"]
    service.run(burst=True)
    assert with_lora.result(timeout=1).finish_reason is FinishReason.LENGTH


def test_an_adapter_unregistered_after_submit_fails_the_request(setup: Any) -> None:
    client, service, engine = setup
    handle = client.submit("p", model=MODEL, lora="poet", max_tokens=2)
    remove_lora(client.redis, Keys(), MODEL, "poet")
    service.intake()
    result = handle.result(timeout=1)
    assert result.finish_reason is FinishReason.ERROR
    assert result.error is not None
    assert "LoRA adapter 'poet' is no longer registered for model 'm'" in result.error
    assert handle.id not in engine.running


def test_a_worker_that_serves_no_adapters_leaves_their_requests_queued(setup: Any) -> None:
    client, _, _ = setup
    engine = ScriptedEngine(lora_rank=0)  # as --max-loras 0
    base_only = WorkerService(engine, client.redis, client.settings, MODEL, "base-only")
    with_lora = client.submit("p", model=MODEL, lora="poet", max_tokens=2, priority="high")
    plain = client.submit("p", model=MODEL, max_tokens=2)
    assert base_only.intake() == 1
    assert list(engine.running) == [plain.id]
    assert with_lora.status().state is RequestState.QUEUED
    _, lora_service, lora_engine = setup
    assert lora_service.intake() == 1
    assert list(lora_engine.running) == [with_lora.id]


def test_a_burst_run_ends_when_only_requests_it_cannot_serve_are_queued(setup: Any) -> None:
    client, _, _ = setup
    engine = ScriptedEngine(lora_rank=0)  # as --max-loras 0
    base_only = WorkerService(engine, client.redis, client.settings, MODEL, "base-only")
    with_lora = client.submit("p", model=MODEL, lora="poet", max_tokens=2)
    plain = client.submit("p", model=MODEL, max_tokens=2)
    base_only.run(burst=True)  # returns: the adapter request is not its to serve
    assert plain.result(timeout=1).finish_reason is FinishReason.LENGTH
    assert with_lora.status().state is RequestState.QUEUED
    _, lora_service, _ = setup
    lora_service.run(burst=True)
    assert with_lora.result(timeout=1).finish_reason is FinishReason.LENGTH
