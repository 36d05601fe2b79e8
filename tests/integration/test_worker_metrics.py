"""A worker process scraped during a run: names, labels, and counts that match what
was submitted. Uses the simulated backend, so it takes seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis

from producer.client import Client
from producer.embedded import EmbeddedRedis, free_port
from shared.models import RequestState
from shared.settings import Settings
from tests.conftest import serve
from tests.integration.faults import wait_until

pytestmark = pytest.mark.integration

SIM = "sim:step_ms=20,knee=8,max_num_seqs=8"


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def test_worker_metrics_match_what_was_submitted(
    real_redis: redis.Redis, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    port = free_port()
    env = {**os.environ, "TOKENQ_WORKER_METRICS_PORT": str(port)}
    cmd = [sys.executable, "-m", "producer.cli", "worker", "--redis", redis_server.url,
           "--model", SIM]  # fmt: skip
    serve(real_redis, SIM)
    client = Client(connection=real_redis, settings=Settings())
    priorities = ["low", "normal", "high", "critical"] * 3
    handles = [client.submit("a b c", model=SIM, priority=p, max_tokens=5) for p in priorities]
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: all(h.status().state is RequestState.FINISHED for h in handles),
                       120, "all requests")  # fmt: skip
            wait_until(lambda: "request_success_total" in _scrape(port), 30, "metrics")
            body = _scrape(port)
        finally:
            worker.terminate()
            worker.wait(timeout=60)
    label = f'model="{SIM}"'
    assert f'tokenq:request_success_total{{finished_reason="length",{label}}} 12.0' in body
    assert f"tokenq:generation_tokens_total{{{label}}} 60.0" in body
    for name in ("low", "normal", "high", "critical"):
        line = f'tokenq:time_to_first_token_seconds_count{{{label},priority="{name}"}} 3.0'
        assert line in body
    assert f"tokenq:num_requests_running{{{label}}}" in body
    assert f"tokenq:kv_cache_usage_perc{{{label}}}" in body
