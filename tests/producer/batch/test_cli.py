"""``tokenq batch``: what a user types and sees, against a real redis-server."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import redis
from typer.testing import CliRunner

from producer.batch.cli import batch_app
from producer.batch.ops import Batches
from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.settings import Settings
from tests.conftest import serve
from tests.producer.batch.conftest import MODEL, batch_settings, jsonl
from tests.producer.batch.test_driver import drive
from tests.worker.fakes import ScriptedEngine
from worker.service import WorkerService

runner = CliRunner()


@pytest.fixture
def url(redis_server: EmbeddedRedis, real_redis: redis.Redis) -> str:
    serve(real_redis, MODEL)
    return redis_server.url


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(batch_app, list(args))
    return result.exit_code, result.output


def test_submit_run_and_read_the_results(url: str, tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text(jsonl(3))
    code, out = invoke("submit", str(tmp_path / "in.jsonl"), "--redis", url, "--priority", "30")
    assert code == 0
    batch_id = out.strip()
    connection = redis.Redis.from_url(url)
    batches = Batches(Client(connection=connection), batch_settings())
    service = WorkerService(ScriptedEngine(), connection, Settings(), MODEL, "w1")
    drive(batches, batch_id, service)
    code, out = invoke("status", batch_id, "--redis", url, "--wait")
    status = orjson.loads(out[out.index("{") :])
    assert (code, status["state"], status["priority"]) == (0, "completed", 30)
    assert status["counts"] == {"total": 3, "completed": 3, "failed": 0, "in_flight": 0}
    out_file, err_file = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    code, out = invoke(
        "results", batch_id, "--redis", url, "--output", str(out_file), "--errors", str(err_file)
    )
    assert code == 0 and "3 output line(s), 0 error line(s)" in out
    ids = [orjson.loads(line)["custom_id"] for line in out_file.read_text().splitlines()]
    assert (ids, err_file.read_text()) == (["line-0", "line-1", "line-2"], "")
    code, out = invoke("list", "--redis", url)
    assert f"{batch_id}  completed    3/3 done  0 failed" in out
    connection.close()


def test_cancel_from_the_command_line(url: str, tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text(jsonl(2))
    batch_id = invoke("submit", str(tmp_path / "in.jsonl"), "--redis", url)[1].strip()
    code, out = invoke("cancel", batch_id, "--redis", url)
    assert (code, out.strip()) == (0, f"{batch_id} cancelling: 0 completed, 0 failed")


def test_bad_input_and_unknown_batches_are_one_clear_line(url: str, tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"custom_id": "a", "prompt": "x"}\nnot json\n')
    code, out = invoke("submit", str(tmp_path / "bad.jsonl"), "--redis", url)
    assert code == 1 and "error: batch input has 1 bad line(s): line 2: not JSON" in out
    code, out = invoke("submit", str(tmp_path / "missing.jsonl"), "--redis", url)
    assert code == 1 and "cannot read" in out
    code, out = invoke("status", "batch_" + "0" * 24, "--redis", url)
    assert code == 1 and "does not exist (or has expired)" in out
    code, out = invoke("results", "nope", "--redis", url)
    assert code == 1 and "malformed batch id 'nope'" in out
