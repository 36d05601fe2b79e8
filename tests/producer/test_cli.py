"""The `tokenq` admin commands against a real redis-server."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import redis
from typer.testing import CliRunner

from producer.cli import app, state_line
from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.keys import Keys, model_tag
from shared.models import RequestState
from shared.settings import Settings
from tests.conftest import serve
from tests.producer.gateway.scripted import MODEL, ScriptedWorker
from tests.shared.test_reaper import kill_every_attempt
from tests.shared.test_scripts import claim

runner = CliRunner()


def _dead_request(client: Client) -> str:
    h = client.submit("poison")
    kill_every_attempt(client, h.id)
    return h.id


def test_dead_list_retry_purge(real_redis: redis.Redis, redis_server: EmbeddedRedis) -> None:
    serve(real_redis, "SmolLM2-135M-Instruct")
    client = Client(connection=real_redis, settings=Settings())
    first, second = _dead_request(client), _dead_request(client)
    url = ["--redis", redis_server.url]
    listed = runner.invoke(app, ["dead", "list", *url])
    assert listed.exit_code == 0
    assert first in listed.stdout and "attempts exhausted" in listed.stdout
    retried = runner.invoke(app, ["dead", "retry", first, *url])
    assert retried.exit_code == 0
    assert client.handle(first).status().state is RequestState.QUEUED
    again = runner.invoke(app, ["dead", "retry", first, *url])
    assert again.exit_code == 1
    assert "not in the dead-letter set" in again.output
    purged = runner.invoke(app, ["dead", "purge", *url])
    assert "purged 1" in purged.stdout
    assert real_redis.zcard(Keys().dead(model_tag("SmolLM2-135M-Instruct"))) == 0
    assert not real_redis.exists(Keys().request(second))


def test_cancel_and_status(real_redis: redis.Redis, redis_server: EmbeddedRedis) -> None:
    serve(real_redis, "SmolLM2-135M-Instruct")
    h = Client(connection=real_redis, settings=Settings()).submit("x", priority="high")
    url = ["--redis", redis_server.url]
    status = runner.invoke(app, ["status", h.id, *url])
    assert '"state": "queued"' in status.stdout and '"priority": 75' in status.stdout
    assert runner.invoke(app, ["cancel", h.id, *url]).stdout.strip() == "cancelled"
    bad = runner.invoke(app, ["cancel", "not-an-id", *url])
    assert bad.exit_code == 1
    assert "malformed request id" in bad.output


UNREACHABLE = "redis://user:s3cret@127.0.0.1:1/0"


@pytest.mark.parametrize(
    "command",
    [
        ["submit", "hi"],
        ["status", "0123abcd-0123456789abcdef01234567"],
        ["cancel", "0123abcd-0123456789abcdef01234567"],
        ["dead", "list"],
        ["batch", "list"],
    ],
)
def test_a_command_that_cannot_reach_redis_says_so_in_one_line(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--redis", UNREACHABLE])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: cannot reach Redis at redis://user:***@127.0.0.1:1/0: ")
    assert "s3cret" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--max-num-seqs", "0"], "max_num_seqs must be an integer of at least 1, got 0"),
        (["--kv-cache-mib", "0"], "kv_cache_mib must be an integer of at least 1"),
    ],
)
def test_a_worker_setting_the_engine_cannot_run_with_is_refused_before_anything_starts(
    option: list[str], message: str, real_redis: redis.Redis, redis_server: EmbeddedRedis
) -> None:
    result = runner.invoke(app, ["worker", *option, "--redis", redis_server.url])
    assert result.exit_code == 2
    assert message in result.output
    assert real_redis.zcard(Keys().workers()) == 0  # nothing was announced


def test_submit_says_where_its_request_stands_in_the_queue(
    real_redis: redis.Redis, redis_server: EmbeddedRedis
) -> None:
    """Two requests wait ahead of it: the line says position 2 (never 'position None');
    the worker starts only once it has been said, so the answer comes after."""
    settings = Settings(redis_url=redis_server.url)
    worker = ScriptedWorker(redis_server.url, settings)
    worker.register()
    ahead = Client(connection=real_redis, settings=settings)
    for prompt in ("first", "second"):
        ahead.submit(prompt, model=MODEL, priority="high")
    starter = threading.Timer(1.0, worker.start)
    starter.start()
    try:
        out = runner.invoke(app, ["submit", "hi", "--model", MODEL, "--redis", redis_server.url])
    finally:
        starter.join()
        worker.stop()
    assert out.exit_code == 0, out.output
    assert "queued at position 2" in out.output
    assert "None" not in out.output


def test_the_state_line_of_a_running_or_ended_request(
    real_redis: redis.Redis, redis_server: EmbeddedRedis
) -> None:
    serve(real_redis, "SmolLM2-135M-Instruct")
    client = Client(connection=real_redis, settings=Settings())
    handle, later = client.submit("x"), client.submit("y")
    assert state_line(handle.status()) == "queued at position 0"
    claim(real_redis, Settings(), 1, worker="w7")
    assert state_line(handle.status()) == "running on w7"
    assert later.cancel() == "cancelled"
    assert state_line(later.status()) == "cancelled"


def test_the_producer_commands_import_nothing_of_the_worker_until_it_is_asked_for() -> None:
    probe = (
        "import sys; from producer.cli import app; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'worker'))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"
