"""Real processes: worker subprocesses on the default model against our redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import openai
import pytest
import redis

from producer.embedded import EmbeddedRedis
from shared.settings import DEFAULT_MODEL
from tests.integration.openai_stack import openai_stack

WorkerFactory = Callable[..., subprocess.Popen[bytes]]


@dataclass
class TokenqRedis:
    """Where a test's tokenq runs: a URL for processes, a connection for the test."""

    url: str
    connection: redis.Redis


@pytest.fixture(params=["redis-server", "redis-cluster"])
def any_real_redis(request: pytest.FixtureRequest) -> TokenqRedis:
    """Runs a test on a real redis-server and on a real 3-master Redis Cluster (flushed)."""
    if request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster").url
        return TokenqRedis(url, request.getfixturevalue("cluster_redis"))
    url = request.getfixturevalue("redis_server").url
    return TokenqRedis(url, request.getfixturevalue("real_redis"))


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The default model as a local directory (converted from GGUF on first use)."""
    from worker.model_store import resolve_model

    path = resolve_model(DEFAULT_MODEL)
    if not isinstance(path, Path):
        pytest.fail(f"default model did not resolve to a directory: {path!r}")
    return path


@pytest.fixture
def start_worker(
    redis_server: EmbeddedRedis, default_model_dir: Path, tmp_path: Path
) -> Iterator[WorkerFactory]:
    """Starts `tokenq worker` processes; kills whatever is left at teardown."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"worker-{len(procs)}.log").open("wb")
        logs.append(log)
        redis_args = [] if "--redis" in args else ["--redis", redis_server.url]
        cmd = [sys.executable, "-m", "producer.cli", "worker", "--model", DEFAULT_MODEL]
        cmd += [*redis_args, *args]
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    for log in logs:
        log.close()


FAULT_ENV = {"TOKENQ_LEASE_MS": "2000", "TOKENQ_WORKER_HEARTBEAT_MS": "400"}


@pytest.fixture(scope="session")
def reference_engine(default_model_dir: Path) -> object:
    """An in-process engine for uninterrupted reference runs."""
    from worker.engine import Engine, EngineConfig

    return Engine(EngineConfig(model=str(default_model_dir), kv_cache_mib=512))


@pytest.fixture
def reference(reference_engine: object) -> Callable[[list[dict[str, object]]], list[list[int]]]:
    """Greedy token ids of an uninterrupted run of the given request bodies."""
    from shared.models import SamplingParams
    from worker.engine import Engine, EngineRequest

    engine = reference_engine
    assert isinstance(engine, Engine)

    def run(bodies: list[dict[str, object]]) -> list[list[int]]:
        reqs = [
            EngineRequest(
                f"ref-{i}",
                engine.encode_chat(body["messages"]),  # type: ignore[arg-type]
                SamplingParams(max_tokens=body["max_tokens"], temperature=0, ignore_eos=True),
            )
            for i, body in enumerate(bodies)
        ]
        outputs = engine.generate(reqs)
        return [[t for o in outputs[r.request_id] for t in o.new_token_ids] for r in reqs]

    return run


@pytest.fixture(scope="module")
def openai_client(
    redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[openai.OpenAI]:
    """An unmodified ``openai`` client on a gateway process and a worker process on the
    default model, for a test module."""
    with openai_stack(redis_server.url, tmp_path_factory.mktemp("worker")) as c:
        yield c
