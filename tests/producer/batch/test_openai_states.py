"""OpenAI's side of a batch's life on fakeredis: the statuses and their timestamps,
the completion window's expiry, the output and error files made as it ends, and the
checks an uploaded batch file gets."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from producer.batch import driver, result_files, store
from producer.batch.file_check import InvalidBatchFile, check_batch_jsonl
from producer.batch.lines import BatchInputError
from producer.batch.openai_object import openai_batch
from producer.batch.ops import Batches
from producer.files.store import FileStore
from tests.producer.batch.conftest import jsonl
from tests.producer.batch.test_driver import custom_ids, drive
from worker.service import WorkerService


def test_a_completed_batch_went_through_finalizing_and_has_an_output_file(
    make_batches: Callable[..., Batches], tokenq_worker: Callable[..., WorkerService]
) -> None:
    batches = make_batches()
    batch_id = batches.submit(jsonl(3), details={"input_file_id": "file-" + "a" * 24})
    drive(batches, batch_id, tokenq_worker())
    shown = openai_batch(batches.status(batch_id))
    assert (shown.status, shown.input_file_id, shown.endpoint) == (
        "completed",
        "file-" + "a" * 24,
        "/v1/chat/completions",
    )
    assert shown.completed_at is not None and shown.finalizing_at is not None
    assert shown.created_at <= shown.finalizing_at <= shown.completed_at
    assert (shown.request_counts.completed, shown.error_file_id) == (3, None)
    assert shown.output_file_id is not None
    files = FileStore(batches.ctx.redis, batches.ctx.settings)
    meta = files.meta(shown.output_file_id)
    content = result_files.content(batches.ctx, meta)
    assert content is not None and custom_ids(content.splitlines()) == [
        "line-0",
        "line-1",
        "line-2",
    ]
    assert files.get(shown.output_file_id).bytes == len(content)


def test_a_batch_past_its_window_expires_with_what_it_finished(
    make_batches: Callable[..., Batches], tokenq_worker: Callable[..., WorkerService]
) -> None:
    batches = make_batches(batch_max_in_flight=1)
    batch_id = batches.submit(jsonl(3))
    worker = tokenq_worker()
    job_id = store.meta(batches.ctx, batch_id)["driver"]
    driver.run_tick(batches.ctx, batch_id, job_id)  # line-0 goes out
    worker.run(burst=True)
    driver.run_tick(batches.ctx, batch_id, job_id)  # line-0 is collected, line-1 goes
    batches.ctx.redis.hset(batches.ctx.bkeys.meta(batch_id), "expires_ms", 1)
    assert driver.run_tick(batches.ctx, batch_id, job_id)
    shown = openai_batch(batches.status(batch_id))
    assert shown.status == "expired" and shown.expired_at is not None
    assert (shown.request_counts.completed, shown.request_counts.failed) == (1, 2)
    outputs, errors = batches.results(batch_id)
    assert custom_ids(outputs) == ["line-0"]
    codes = {orjson.loads(e)["custom_id"]: orjson.loads(e)["error"]["code"] for e in errors}
    assert codes["line-2"] == "batch_expired"  # never sent
    assert shown.error_file_id is not None and shown.output_file_id is not None


def test_a_cancel_notes_when_it_began_and_ended(
    make_batches: Callable[..., Batches], tokenq_worker: Callable[..., WorkerService]
) -> None:
    batches = make_batches(batch_max_in_flight=1)
    batch_id = batches.submit(jsonl(2))
    assert batches.cancel(batch_id).state == "cancelling"
    drive(batches, batch_id, tokenq_worker())
    shown = openai_batch(batches.status(batch_id))
    assert shown.status == "cancelled"
    assert shown.cancelling_at is not None and shown.cancelled_at is not None
    assert shown.completed_at is None and shown.output_file_id is None
    assert shown.error_file_id is not None


def test_lines_that_call_another_endpoint_are_refused_by_custom_id(
    make_batches: Callable[..., Batches],
) -> None:
    batches = make_batches()
    mixed = jsonl(1) + jsonl(1, url="/v1/completions").replace("line-0", "c")
    with pytest.raises(BatchInputError, match="custom_id 'c': its url is /v1/completions"):
        batches.submit(mixed, endpoint="/v1/chat/completions")
    assert batches.status(batches.submit(mixed)).endpoint == "mixed"


def test_pages_of_batches_follow_after(make_batches: Callable[..., Batches]) -> None:
    batches = make_batches()
    made = [batches.submit(jsonl(1)) for _ in range(3)]
    first = batches.page(2)
    assert ([b.id for b in first.items], first.has_more) == (made[:0:-1], True)
    rest = batches.page(2, after=made[1])
    assert ([b.id for b in rest.items], rest.has_more) == ([made[0]], False)


def test_batches_made_in_one_millisecond_still_list_newest_first(
    make_batches: Callable[..., Batches],
) -> None:
    batches = make_batches()
    made = [batches.submit(jsonl(1)) for _ in range(20)]  # several a millisecond
    listed = batches.page(20)
    assert [b.id for b in listed.items] == made[::-1] and not listed.has_more


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "the file has no lines"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[1]", "line 1: a line must be a JSON object"),
        (b'{"custom_id": "a", "method": "GET"}', "line 1: method: must be 'POST'"),
        (
            b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": 1}',
            "line 1: body",
        ),
    ],
)
def test_a_batch_file_is_refused_naming_what_is_wrong(data: bytes, problem: str) -> None:
    with pytest.raises(InvalidBatchFile, match=problem) as refused:
        check_batch_jsonl(data, max_lines=10)
    assert refused.value.param == "file"


def test_a_good_batch_file_counts_its_lines_and_the_line_cap_holds() -> None:
    data = jsonl(3).encode() + b"\n\n"
    assert check_batch_jsonl(data, max_lines=3) == 3
    with pytest.raises(InvalidBatchFile, match="3 lines, over the limit of 2"):
        check_batch_jsonl(data, max_lines=2)
