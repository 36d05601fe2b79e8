"""A fleet where only some workers serve LoRA adapters: two real `tokenq worker`
processes against a real redis-server, one started with `--max-loras 0`. Every adapter
request is claimed and finished by the other; the base-only one takes base work
meanwhile. On the simulated model (which runs an adapter request as the base model:
what is under test is who claims it), and on the default model with a real adapter,
where a base-only worker that claimed one would end it with an error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.keys import Keys, model_tag
from shared.loras import new_adapter, register_lora
from shared.models import FinishReason, RequestState
from shared.replies import text
from shared.settings import DEFAULT_MODEL, Settings
from tests.integration.conftest import WorkerFactory
from tests.integration.faults import wait_until
from tests.lora_adapters import SPECS, make_adapter

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SIM = "sim:step_ms=20,knee=4,max_num_seqs=4"
NUM_EACH = 16
QUESTION = [{"role": "user", "content": "Write one line about the sea."}]
Start = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def start(redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Start]:
    """Starts `tokenq worker --model SIM` processes; stops whatever is left."""
    procs: list[subprocess.Popen[bytes]] = []

    def run(*args: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"worker-{len(procs)}.log").open("wb")
        cmd = [sys.executable, "-m", "producer.cli", "worker", "--model", SIM]
        cmd += ["--redis", redis_server.url, *args]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        log.close()  # the child holds its own descriptor
        procs.append(proc)
        return proc

    yield run
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=60)


def worker_ids(connection: redis.Redis) -> dict[int, str]:
    """Registered worker ids by pid (an id is '<host>-<pid>-<hex>')."""
    ids: Any = connection.zrange(Keys().workers(), 0, -1)
    return {int(text(i).rsplit("-", 2)[1]): text(i) for i in ids}


def test_every_adapter_request_is_served_by_the_worker_that_serves_adapters(
    start: Start, redis_server: EmbeddedRedis, real_redis: redis.Redis
) -> None:
    workers = base_only, with_loras = start("--max-loras", "0"), start()
    wait_until(lambda: len(worker_ids(real_redis)) == 2, 60, "both workers to register")
    by_pid = worker_ids(real_redis)
    # Each says in the registry which adapter requests it claims.
    wait_until(lambda: num_serving(real_redis) == 2, 60, "both workers to serve")
    ranks = [real_redis.hget(Keys().worker(by_pid[p.pid]), "max_lora_rank") for p in workers]
    assert ranks == [b"0", b"16"]
    register_lora(real_redis, Keys(), new_adapter(SIM, "poet", "/on/the/workers/poet", 8))
    with Client(settings=Settings(redis_url=redis_server.url, max_queued=1000)) as client:
        # Adapter requests first and at a higher priority: they head the queue, where
        # the base-only worker sees them at every claim.
        body = {"model": SIM, "prompt": "a b c", "sampling": {"max_tokens": 8}}
        adapter = client.submit_many([{**body, "lora": "poet", "priority": "high"}] * NUM_EACH)
        base = client.submit_many([body] * NUM_EACH)
        results = [h.result(timeout=120) for h in adapter + base]
        served_by = {h.id: h.status().worker for h in adapter + base}
    assert {r.finish_reason for r in results} == {FinishReason.LENGTH}
    assert {served_by[h.id] for h in adapter} == {by_pid[with_loras.pid]}
    assert by_pid[base_only.pid] in {served_by[h.id] for h in base}
    assert real_redis.zcard(Keys().lora_ranks(model_tag(SIM))) == 0  # marks all dropped


def test_on_the_default_model_adapter_requests_wait_for_a_worker_that_serves_them(
    start_worker: WorkerFactory,
    default_model_dir: Path,
    redis_server: EmbeddedRedis,
    real_redis: redis.Redis,
    tmp_path: Path,
) -> None:
    adapter = make_adapter(str(default_model_dir), SPECS[1], tmp_path)  # rank 4
    register_lora(real_redis, Keys(), new_adapter(DEFAULT_MODEL, "pirate", str(adapter)))
    base_only = start_worker("--max-loras", "0")
    wait_until(lambda: num_serving(real_redis) == 1, 180, "the base-only worker to serve")
    with Client(settings=Settings(redis_url=redis_server.url)) as client:
        body: dict[str, Any] = {"messages": QUESTION, "max_tokens": 8, "temperature": 0}
        pirate = [client.submit(lora="pirate", priority="high", **body) for _ in range(3)]
        base = [client.submit(**body) for _ in range(3)]
        base_results = [h.result(timeout=300) for h in base]
        # Ahead of the base work, and still queued: no worker up serves them yet.
        assert [h.status().state for h in pirate] == [RequestState.QUEUED] * 3
        with_loras = start_worker()
        pirate_results = [h.result(timeout=300) for h in pirate]
        served_by = {h.id: h.status().worker for h in pirate + base}
    by_pid = worker_ids(real_redis)
    assert [r.error for r in pirate_results + base_results] == [None] * 6
    assert {served_by[h.id] for h in pirate} == {by_pid[with_loras.pid]}
    assert {served_by[h.id] for h in base} == {by_pid[base_only.pid]}
    assert pirate_results[0].text != base_results[0].text  # the adapter made the difference


def num_serving(connection: redis.Redis) -> int:
    keys = Keys()
    states = [connection.hget(keys.worker(i), "state") for i in worker_ids(connection).values()]
    return states.count(b"serving")
