"""The `tokenq` admin commands against a real redis-server."""

from __future__ import annotations

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
