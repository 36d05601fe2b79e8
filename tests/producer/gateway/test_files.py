"""Files and file-made batches over HTTP with the unmodified ``openai`` SDK, against a
real gateway (uvicorn in a thread), a real redis-server and a scripted worker; the
batch is driven tick by tick here, as an RQ worker would."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

from producer.batch import driver, store
from producer.batch.ops import Batches
from producer.client import Client
from producer.embedded import EmbeddedRedis
from tests.producer.batch.conftest import batch_settings
from tests.producer.gateway.conftest import RunningGateway, serve
from tests.producer.gateway.scripted import MODEL

FILE_LIMIT_BYTES = 4096
KEYS = "sk-ops=ops:critical,sk-web=web:normal"
MAX_TICKS = 200


@pytest.fixture
def files_gateway(redis_server: EmbeddedRedis) -> Iterator[RunningGateway]:
    yield from serve(redis_server, KEYS, files_max_bytes=FILE_LIMIT_BYTES)


def sdk(gateway: RunningGateway, key: str = "sk-web") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)


def jsonl(num_lines: int, url: str = "/v1/chat/completions") -> bytes:
    lines = []
    for i in range(num_lines):
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 3}
        if url == "/v1/completions":
            body["prompt"] = f"p {i}"
        else:
            body["messages"] = [{"role": "user", "content": f"hello {i}"}]
        lines.append({"custom_id": f"line-{i}", "method": "POST", "url": url, "body": body})
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def drive(gateway: RunningGateway, batch_id: str) -> None:
    """Ticks of the batch's driver until it ends (the scripted worker runs its lines)."""
    batches = Batches(Client(connection=gateway.redis, settings=batch_settings(gateway.settings)))
    for _ in range(MAX_TICKS):
        m = store.meta(batches.ctx, batch_id)
        if driver.run_tick(batches.ctx, batch_id, m["driver"]):
            return
    raise AssertionError(f"batch {batch_id} did not end in {MAX_TICKS} ticks")


def test_upload_list_retrieve_download_delete(files_gateway: RunningGateway) -> None:
    client = sdk(files_gateway)
    data = jsonl(2)
    first = client.files.create(file=("in.jsonl", data), purpose="batch")
    second = client.files.create(file=("notes.txt", b"hello"), purpose="user_data")
    assert (first.object, first.bytes, first.filename, first.purpose, first.status) == (
        "file",
        len(data),
        "in.jsonl",
        "batch",
        "processed",
    )
    assert first.expires_at is not None and first.expires_at > first.created_at
    assert client.files.retrieve(first.id) == first
    assert client.files.content(first.id).read() == data
    newest = client.files.list()
    assert [f.id for f in newest.data] == [second.id, first.id]
    assert [f.id for f in client.files.list(order="asc", limit=1)] == [first.id, second.id]
    assert [f.id for f in client.files.list(purpose="batch")] == [first.id]
    deleted = client.files.delete(first.id)
    assert (deleted.id, deleted.deleted) == (first.id, True)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(first.id)
    assert [f.id for f in client.files.list()] == [second.id]


def test_another_tenants_file_is_not_found(files_gateway: RunningGateway) -> None:
    mine = sdk(files_gateway, "sk-web").files.create(file=("in.jsonl", jsonl(1)), purpose="batch")
    theirs = sdk(files_gateway, "sk-ops")
    with pytest.raises(openai.NotFoundError):
        theirs.files.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.files.content(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.files.delete(mine.id)
    with pytest.raises(openai.NotFoundError) as refused:
        theirs.batches.create(
            input_file_id=mine.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert refused.value.body["param"] == "input_file_id"  # type: ignore[index]
    assert list(theirs.files.list()) == []


def test_a_file_past_the_limit_is_413_naming_the_limit(files_gateway: RunningGateway) -> None:
    client = sdk(files_gateway)
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", b"x" * (FILE_LIMIT_BYTES + 1)), purpose="user_data")
    assert refused.value.status_code == 413
    assert f"the limit is {FILE_LIMIT_BYTES} bytes" in refused.value.message
    assert "TOKENQ_FILES_MAX_BYTES" in refused.value.message
    # Past the limit with the form around it too: refused before the body is read.
    with pytest.raises(openai.APIStatusError) as guarded:
        client.files.create(file=("big.jsonl", b"x" * 100_000), purpose="user_data")
    assert guarded.value.status_code == 413
    assert f"the limit is {FILE_LIMIT_BYTES} bytes" in guarded.value.message


def test_malformed_batch_jsonl_is_refused_naming_its_lines(files_gateway: RunningGateway) -> None:
    client = sdk(files_gateway)
    good = orjson.loads(jsonl(1))
    lines = [
        orjson.dumps(good),
        b"{not json",
        orjson.dumps({**good, "url": "/v1/images"}),
        orjson.dumps(good),  # the same custom_id again
        orjson.dumps({k: v for k, v in good.items() if k != "body"}),
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("bad.jsonl", b"\n".join(lines)), purpose="batch")
    message = refused.value.message
    assert refused.value.body["param"] == "file"  # type: ignore[index]
    assert "4 bad line(s)" in message
    for expected in ("line 2: not JSON", "line 3: url", "line 4: custom_id", "line 5: body"):
        assert expected in message
    with pytest.raises(openai.BadRequestError) as purpose:
        client.files.create(file=("x.jsonl", jsonl(1)), purpose="fine-tune")
    assert purpose.value.body["param"] == "purpose"  # type: ignore[index]


def test_a_batch_from_a_file_runs_to_its_output_file(files_gateway: RunningGateway) -> None:
    client = sdk(files_gateway)
    upload = client.files.create(file=("in.jsonl", jsonl(3)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert (batch.status, batch.input_file_id, batch.metadata) == (
        "in_progress",
        upload.id,
        {"job": "nightly"},
    )
    assert batch.request_counts is not None and batch.request_counts.total == 3
    assert batch.expires_at == batch.created_at + 24 * 3600
    drive(files_gateway, batch.id)
    done = client.batches.retrieve(batch.id)
    assert (done.status, done.error_file_id) == ("completed", None)
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    assert done.completed_at is not None and done.finalizing_at is not None
    assert done.output_file_id is not None
    output = client.files.content(done.output_file_id).read()
    lines = [orjson.loads(line) for line in output.splitlines()]
    assert [line["custom_id"] for line in lines] == ["line-0", "line-1", "line-2"]
    assert all(line["response"]["status_code"] == 200 for line in lines)
    info = client.files.retrieve(done.output_file_id)
    assert (info.purpose, info.bytes) == ("batch_output", len(output))


def test_bad_batch_requests_name_what_was_wrong(files_gateway: RunningGateway) -> None:
    client = sdk(files_gateway)
    chat = client.files.create(file=("in.jsonl", jsonl(1)), purpose="batch")
    notes = client.files.create(file=("n.txt", b"hi"), purpose="user_data")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input_file_id": chat.id, "endpoint": "/v1/embeddings"}, "line-0"),
        ({"input_file_id": notes.id, "endpoint": "/v1/chat/completions"}, "purpose"),
        ({"input_file_id": chat.id, "endpoint": "/v1/moderations"}, "endpoint"),
    ]
    for params, named in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            client.batches.create(completion_window="24h", **params)
        assert named in refused.value.message, refused.value.message
    with pytest.raises(openai.BadRequestError) as window:
        client.batches.create(
            input_file_id=chat.id,
            endpoint="/v1/chat/completions",
            completion_window="1h",  # type: ignore[arg-type]
        )
    assert window.value.body["param"] == "completion_window"  # type: ignore[index]


def test_batches_list_pages_with_after_and_limit(files_gateway: RunningGateway) -> None:
    client = sdk(files_gateway)
    upload = client.files.create(file=("in.jsonl", jsonl(1)), purpose="batch")
    made = [
        client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for _ in range(3)
    ]
    first = client.batches.list(limit=1)
    assert [b.id for b in first.data] == [made[-1]]
    assert first.has_more is True
    assert [b.id for b in client.batches.list(limit=1)] == made[::-1]  # auto-pagination
    last = client.batches.list(limit=2, after=made[1])
    assert ([b.id for b in last.data], last.has_more) == ([made[0]], False)
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.list(after="batch_" + "0" * 24)
    assert refused.value.body["param"] == "after"  # type: ignore[index]
    assert list(sdk(files_gateway, "sk-ops").batches.list()) == []
