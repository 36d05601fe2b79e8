"""`tokenq up` says it is up only once its worker serves, then says where the gateway
listens, whether it wants API keys and what to try next; and it stops quietly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from producer.embedded import free_port
from shared.keys import Keys
from shared.registry import live_workers_of
from shared.settings import DEFAULT_MODEL
from tests.integration.test_cli import Output

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _serving_states(redis_url: str) -> list[str]:
    """The registry states of the default model's workers."""
    connection = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        keys = Keys()
        ids = live_workers_of(connection, keys, DEFAULT_MODEL)
        return [str(connection.hget(keys.worker(i), "state")) for i in ids]
    finally:
        connection.close()


def test_up_announces_a_serving_worker_its_gateway_and_keys(
    tmp_path: Path, default_model_dir: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "TOKENQ_MODEL_CACHE_DIR": str(default_model_dir.parent),
        "TOKENQ_API_KEYS": "sk-up-test=acme:high",
    }
    env.pop("TOKENQ_REDIS_URL", None)
    command = [sys.executable, "-m", "producer.cli", "up", "--port", str(port)]
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as up:
        output = Output(up)
        try:
            up_line = output.wait_until_up()
            redis_url = (tmp_path / ".cache" / "tokenq" / "up.url").read_text()
            assert "serving" in _serving_states(redis_url), "".join(output.lines)
            said = "".join(output.lines)
            # The worker's self-check passed before `tokenq up` said it was up.
            assert said.index("self-check passed") < said.index(up_line), said
            assert f"HTTP (OpenAI-compatible): http://127.0.0.1:{port}/v1" in said
            assert "API keys: on (TOKENQ_API_KEYS)" in said
            assert 'submit "Tell me a joke" --stream' in said
            assert f"curl http://127.0.0.1:{port}/v1/chat/completions" in said
            assert "Authorization: Bearer <key>" in said
        finally:
            up.send_signal(signal.SIGINT)
            up.wait(timeout=120)
            output.join(timeout=10)
    assert up.returncode == 0, "".join(output.lines)
    assert "worker" in "".join(output.lines) and "stopped" in "".join(output.lines)
    # A worker's exit is quiet: no extension reporting objects the teardown kept.
    assert "leaked" not in "".join(output.lines), "".join(output.lines)
