"""Coming up: a worker or a gateway before its Redis, a worker while its model loads."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import redis

from producer.client import Client
from shared.errors import UnknownModel
from shared.keys import Keys
from shared.models import FinishReason, RequestState
from shared.replies import text
from shared.settings import Settings
from tests.conftest import serve
from tests.integration.conftest import WorkerFactory
from tests.integration.faults import RedisProcess, wait_until
from tests.producer.gateway.process import gateway_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def worker_states(connection: redis.Redis) -> list[str]:
    keys = Keys()
    ids = [text(i) for i in connection.zrange(keys.workers(), 0, -1)]
    states = [connection.hget(keys.worker(i), "state") for i in ids]
    return [text(s) for s in states if s is not None]


def test_a_worker_started_before_its_redis_waits_says_so_and_then_serves(
    tmp_path: Path, start_worker: WorkerFactory
) -> None:
    server = RedisProcess(tmp_path)
    worker = start_worker("--model", "sim:", "--redis", server.url)
    log = tmp_path / "worker-0.log"
    wait_until(lambda: "cannot reach Redis at" in log.read_text(), 60, "the worker to say so")
    assert worker.poll() is None, "the worker should wait, not exit"
    server.start()
    try:
        client = Client(server.url, settings=Settings(redis_url=server.url))
        wait_until(lambda: "serving" in worker_states(client.redis), 60, "the worker to serve")
        result = client.submit("hi", model="sim:", max_tokens=3).result(timeout=60)
        assert result.finish_reason is FinishReason.LENGTH
        assert "Traceback" not in log.read_text()
    finally:
        server.stop()


def test_requests_submitted_while_the_model_loads_queue_and_run(
    real_redis: redis.Redis, start_worker: WorkerFactory
) -> None:
    client = Client(connection=real_redis, settings=Settings())
    with pytest.raises(UnknownModel):  # no worker has ever served it
        client.submit("hi", max_tokens=4)
    start_worker()
    wait_until(lambda: worker_states(real_redis) != [], 60, "the worker to announce itself")
    handle = client.submit("Say hi", max_tokens=4, temperature=0)
    assert handle.status().state is RequestState.QUEUED
    assert worker_states(real_redis) == ["loading"], "accepted before the model was ready"
    result = handle.result(timeout=300)
    assert result.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert worker_states(real_redis) == ["serving"]


def test_a_gateway_started_before_its_redis_is_not_ready_until_redis_answers(
    tmp_path: Path,
) -> None:
    server = RedisProcess(tmp_path)
    with gateway_process(server.url, probe="/healthz") as url, httpx.Client(base_url=url) as http:
        waiting = http.get("/readyz")
        assert waiting.status_code == 503
        assert "Redis is unreachable" in waiting.json()["error"]["message"]
        server.start()
        try:
            serve(redis.Redis.from_url(server.url), "sim:")
            wait_until(lambda: http.get("/readyz").status_code == 200, 30, "ready")
            body = {"model": "sim:", "prompt": "hi", "sampling": {"max_tokens": 2}}
            assert http.post("/v1/requests", json=body).status_code == 202
        finally:
            server.stop()
