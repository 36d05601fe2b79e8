"""Batches when tokenq runs on a Redis Cluster: RQ does not, so batches live on their own
plain Redis (TOKENQ_BATCH_REDIS_URL); without one, batch commands and routes say so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from redis.cluster import RedisCluster
from typer.testing import CliRunner

from producer.api_keys import parse_api_keys
from producer.batch.cli import batch_app
from producer.batch.models import BatchState
from producer.batch.ops import Batches
from producer.client import Client
from producer.embedded import EmbeddedRedis
from producer.gateway.app import create_app
from producer.gateway.config import GatewayConfig
from shared.keys import BatchKeys
from shared.settings import Settings
from tests.cluster import LocalCluster
from tests.conftest import serve
from tests.producer.batch.conftest import MODEL, jsonl
from tests.producer.batch.procs import RqWorkers, rq_batch_settings, tokenq_worker, wait_for
from tests.producer.gateway.conftest import ThreadedServer

pytestmark = pytest.mark.integration
NAMES_THE_SETTING = "set TOKENQ_BATCH_REDIS_URL"


@pytest.fixture
def rq_workers(
    redis_cluster: LocalCluster, redis_server: EmbeddedRedis, tmp_path: Path
) -> Iterator[RqWorkers]:
    workers = RqWorkers(redis_cluster.url, tmp_path, TOKENQ_BATCH_REDIS_URL=redis_server.url)
    yield workers
    workers.stop_all()


def test_a_batch_runs_on_its_own_redis_while_its_requests_run_on_the_cluster(
    redis_cluster: LocalCluster,
    cluster_redis: RedisCluster,
    redis_server: EmbeddedRedis,
    real_redis: redis.Redis,
    rq_workers: RqWorkers,
) -> None:
    serve(cluster_redis, MODEL)  # type: ignore[arg-type]
    settings = rq_batch_settings().model_copy(
        update={"redis_url": redis_cluster.url, "batch_redis_url": redis_server.url}
    )
    batches = Batches(Client(settings=settings))
    rq_workers.start("--no-scheduler")
    with tokenq_worker(redis_cluster.url, MODEL):
        batch_id = batches.submit(jsonl(40))
        wait_for(lambda: batches.status(batch_id).state.terminal, 60, "the batch to end")
    status = batches.status(batch_id)
    assert (status.state, status.counts.completed) == (BatchState.COMPLETED, 40)
    outputs, errors = batches.results(batch_id)
    assert len(outputs) == 40 and errors == []
    assert real_redis.exists(BatchKeys().meta(batch_id))  # the batch's own Redis
    assert not cluster_redis.exists(BatchKeys().meta(batch_id))


def test_without_a_batch_redis_the_cli_says_what_to_set(redis_cluster: LocalCluster) -> None:
    runner = CliRunner()
    for args in (["list"], ["worker", "--burst"]):
        result = runner.invoke(batch_app, [*args, "--redis", redis_cluster.url])
        assert result.exit_code == 1, result.output
        assert NAMES_THE_SETTING in result.output, result.output
        assert "Traceback" not in result.output


def test_without_a_batch_redis_the_gateway_answers_503_saying_what_to_set(
    redis_cluster: LocalCluster, cluster_redis: RedisCluster
) -> None:
    app = create_app(
        Settings(redis_url=redis_cluster.url), GatewayConfig(api_keys=parse_api_keys(""))
    )
    with ThreadedServer(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        listed = http.get("/v1/batches")
        created = http.post("/v1/batches", json={"requests": [{"custom_id": "a"}]})
    for reply in (listed, created):
        assert reply.status_code == 503, reply.text
        assert NAMES_THE_SETTING in reply.json()["error"]["message"]
