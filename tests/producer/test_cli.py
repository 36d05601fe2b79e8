"""The `tokenq` admin commands against a real redis-server."""

from __future__ import annotations

import pytest
import redis
from typer.testing import CliRunner

from producer.cli import app
from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.keys import Keys, model_tag
from shared.models import RequestState
from shared.settings import Settings
from tests.conftest import serve
from tests.shared.test_reaper import kill_every_attempt

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
