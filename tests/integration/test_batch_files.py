"""OpenAI's batch flow with the unmodified ``openai`` SDK: files upload -> batch by
input_file_id -> poll -> download the output file, against a real gateway process, a
real redis-server, a worker process on the default model and an RQ batch worker
process; list pagination, cancel of a running batch, and what is refused."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
import redis
from openai.types import Batch

from producer.embedded import EmbeddedRedis
from shared.settings import DEFAULT_MODEL
from tests.integration.openai_stack import WORKER_ARGS
from tests.integration.test_batch_openai import comparable
from tests.producer.batch.procs import RqWorkers, wait_for
from tests.producer.gateway.process import gateway_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]
KEYS = "sk-web=web:normal,sk-ops=ops:normal,sk-pager=pager:normal"
FILE_LIMIT_BYTES = 64 * 1024
BATCH_TIMEOUT_S = 240.0
PROMPTS = ["Name a colour.", "What is 2 plus 2?", "Say hello.", "Name a fruit."]
TERMINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def gateway_url(
    redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A keyed gateway, a worker on the default model and an RQ batch worker that sends
    two lines at a time (so a batch is still running when a test cancels it)."""
    redis.Redis.from_url(redis_server.url).flushall()
    logs = tmp_path_factory.mktemp("batch-files")
    rq = RqWorkers(redis_server.url, logs, TOKENQ_BATCH_MAX_IN_FLIGHT="2")
    cmd = [sys.executable, "-m", "producer.cli", "worker", "--model", DEFAULT_MODEL, *WORKER_ARGS]
    env = {"TOKENQ_FILES_MAX_BYTES": str(FILE_LIMIT_BYTES)}
    with (
        (logs / "worker.log").open("wb") as log,
        gateway_process(redis_server.url, KEYS, **env) as url,
    ):
        worker = subprocess.Popen([*cmd, "--redis", redis_server.url], stdout=log, stderr=log)
        try:
            rq.start("--no-scheduler")
            served = lambda: [m.id for m in sdk(url).models.list()] == [DEFAULT_MODEL]  # noqa: E731
            wait_for(served, 180, "the worker to serve the default model")
            yield url
        finally:
            rq.stop_all()
            worker.kill()
            worker.wait(timeout=30)


def sdk(url: str, key: str = "sk-web") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def body(prompt: str, max_tokens: int = 12) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}]
    return {
        "model": DEFAULT_MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def batch_file(bodies: dict[str, dict[str, Any]]) -> bytes:
    lines = [
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": b}
        for custom_id, b in bodies.items()
    ]
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def start_batch(client: openai.OpenAI, bodies: dict[str, dict[str, Any]]) -> str:
    upload = client.files.create(file=("in.jsonl", batch_file(bodies)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


def ended(client: openai.OpenAI, batch_id: str) -> Batch:
    def terminal() -> Batch | None:
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in TERMINAL else None

    found: Batch = wait_for(terminal, BATCH_TIMEOUT_S, f"batch {batch_id} to end")
    return found


def num_completed(client: openai.OpenAI, batch_id: str) -> int:
    counts = client.batches.retrieve(batch_id).request_counts
    return 0 if counts is None else counts.completed


def lines_of(client: openai.OpenAI, file_id: str | None) -> dict[str, Any]:
    assert file_id is not None
    content = client.files.content(file_id).read()
    return {line["custom_id"]: line for line in map(orjson.loads, content.splitlines())}


def test_a_file_batch_answers_each_line_as_the_route_answers_it_alone(gateway_url: str) -> None:
    client = sdk(gateway_url)
    bodies = {f"q{i}": body(prompt) for i, prompt in enumerate(PROMPTS)}
    done = ended(client, start_batch(client, bodies))
    assert (done.status, done.error_file_id) == ("completed", None)
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (4, 4)
    outputs = lines_of(client, done.output_file_id)
    assert sorted(outputs) == sorted(bodies)
    for custom_id, b in bodies.items():
        alone = client.chat.completions.with_raw_response.create(**b).http_response.json()
        assert outputs[custom_id]["response"]["status_code"] == 200
        assert comparable(outputs[custom_id]["response"]["body"]) == comparable(alone)


def test_batches_list_pages_one_at_a_time(gateway_url: str) -> None:
    client = sdk(gateway_url, "sk-pager")
    made = [start_batch(client, {"only": body("Hi.", max_tokens=2)}) for _ in range(3)]
    first = client.batches.list(limit=1)
    assert ([b.id for b in first.data], first.has_more) == ([made[-1]], True)
    assert [b.id for b in client.batches.list(limit=1)] == made[::-1]
    for batch_id in made:
        ended(client, batch_id)


def test_cancel_of_a_running_batch_ends_cancelled_with_partial_counts(gateway_url: str) -> None:
    client = sdk(gateway_url, "sk-ops")
    bodies = {f"c{i}": body(f"Count from 1 to 50, number {i}.", max_tokens=48) for i in range(12)}
    batch_id = start_batch(client, bodies)
    wait_for(lambda: num_completed(client, batch_id) >= 1, BATCH_TIMEOUT_S, "a line to complete")
    assert client.batches.cancel(batch_id).status in ("cancelling", "cancelled")
    done = ended(client, batch_id)
    counts = done.request_counts
    assert done.status == "cancelled" and counts is not None
    assert done.cancelling_at is not None and done.cancelled_at is not None
    assert counts.completed >= 1 and counts.failed >= 1
    assert counts.completed + counts.failed == counts.total == 12
    outputs, errors = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    assert sorted([*outputs, *errors]) == sorted(bodies)
    assert {e["error"]["code"] for e in errors.values()} <= {"batch_cancelled", "cancelled"}


def test_refusals_size_tenant_and_malformed_lines(gateway_url: str) -> None:
    web, ops = sdk(gateway_url, "sk-web"), sdk(gateway_url, "sk-ops")
    with pytest.raises(openai.APIStatusError) as too_big:
        web.files.create(file=("big.jsonl", b"x" * (FILE_LIMIT_BYTES + 1)), purpose="user_data")
    assert too_big.value.status_code == 413
    assert f"the limit is {FILE_LIMIT_BYTES} bytes" in too_big.value.message
    mine = web.files.create(file=("in.jsonl", batch_file({"a": body("Hi.")})), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        ops.files.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        ops.files.content(mine.id)
    with pytest.raises(openai.BadRequestError) as malformed:
        web.files.create(file=("bad.jsonl", b'{"custom_id": "a"}\nnot json\n'), purpose="batch")
    assert "2 bad line(s)" in malformed.value.message
    assert "line 1: method" in malformed.value.message
    assert "line 2: not JSON" in malformed.value.message
