"""A vLLM worker that speculates (n-gram drafts, which vLLM's CPU build runs) shows its
speculative acceptance and its preemption count in the registry and in its metrics,
under the built-in engine's names."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
import redis

from producer.client import Client
from producer.embedded import EmbeddedRedis, free_port
from shared.keys import Keys
from shared.replies import text
from shared.settings import DEFAULT_MODEL
from tests.integration.faults import serving, wait_until
from tests.integration.vllm_stack import START_TIMEOUT_S, VLLM_ENV, vllm_bin, worker_args

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
# An answer that copies its prompt: n-gram drafts find their matches in it.
COPY = "Repeat this list exactly: apple, pear, plum, fig, lime, kiwi, date, lemon, melon."


def _start(url: str, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [str(vllm_bin("tokenq")), "worker", "--engine", "vllm", "--model", DEFAULT_MODEL]
    cmd += ["--redis", url, *worker_args(), "--speculative-config", json.dumps(NGRAM)]
    env = {**os.environ, **VLLM_ENV, "TOKENQ_WORKER_METRICS_PORT": str(port)}
    with log_path.open("wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        body = reply.read().decode()
    found = re.search(rf'^{re.escape(name)}{{model="{DEFAULT_MODEL}"}} (\S+)$', body, re.M)
    assert found is not None, f"{name} is not in the worker's metrics"
    return float(found.group(1))


def test_speculative_acceptance_and_preemptions_are_shown(
    redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    connection = redis.Redis.from_url(redis_server.url)
    connection.flushall()
    port, log_path = free_port(), tmp_path / "vllm.log"
    worker = _start(redis_server.url, port, log_path)
    try:
        wait_until(lambda: serving(connection, worker.pid), START_TIMEOUT_S, "the vLLM worker")
        with Client(redis_server.url) as client:
            messages = [{"role": "user", "content": COPY}]
            handle = client.submit(
                model=DEFAULT_MODEL, messages=messages, max_tokens=48, temperature=0
            )
            assert handle.result(timeout=600).error is None
        keys = Keys()
        (worker_id,) = [text(w) for w in connection.zrange(keys.workers(), 0, -1)]

        def shown() -> dict[str, str]:
            return {text(k): text(v) for k, v in connection.hgetall(keys.worker(worker_id)).items()}

        wait_until(lambda: "spec_acceptance_rate" in shown(), 60, "the acceptance rate")
        drafted = _metric(port, "tokenq:spec_decode_num_draft_tokens_total")
        accepted = _metric(port, "tokenq:spec_decode_num_accepted_tokens_total")
        assert drafted > 0 and 0 <= accepted <= drafted
        rate = _metric(port, "tokenq:spec_decode_acceptance_rate")
        assert rate == pytest.approx(accepted / drafted)
        assert float(shown()["spec_acceptance_rate"]) == pytest.approx(rate, abs=1e-3)
        assert int(shown()["preemptions"]) == _metric(port, "tokenq:num_preemptions_total")
    finally:
        worker.terminate()  # it drains (tests/integration/test_vllm_drain.py)
        worker.wait(timeout=120)
        connection.close()
