"""A batch driven tick by tick against fakeredis and a scripted tokenq worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from producer.batch import driver, store
from producer.batch.collect import _streams as collect_streams
from producer.batch.collect import collect
from producer.batch.models import BatchState
from producer.batch.ops import Batches
from producer.client import Client
from shared.errors import NotFound
from shared.models import RequestState
from shared.replies import text
from shared.settings import Settings
from tests.producer.batch.conftest import MODEL, jsonl
from worker.service import WorkerService

MAX_ROUNDS = 100


def drive(batches: Batches, batch_id: str, worker: WorkerService | None) -> int:
    """Ticks (with the tokenq worker draining its queue between) until the batch ends."""
    for rounds in range(1, MAX_ROUNDS + 1):
        job_id = store.meta(batches.ctx, batch_id)["driver"]
        if driver.run_tick(batches.ctx, batch_id, job_id):
            return rounds
        if worker is not None:
            worker.run(burst=True)
    raise AssertionError(f"batch {batch_id} did not end in {MAX_ROUNDS} ticks")


def custom_ids(lines: list[bytes]) -> list[str]:
    return [orjson.loads(line)["custom_id"] for line in lines]


def test_a_batch_completes_with_outputs_by_custom_id(
    make_batches: Callable[..., Batches], tokenq_worker: Callable[..., WorkerService]
) -> None:
    batches = make_batches()
    batch_id = batches.submit(jsonl(10) + jsonl(1, url="/v1/completions").replace("-0", "-c"))
    drive(batches, batch_id, tokenq_worker())
    status = batches.status(batch_id)
    assert status.state is BatchState.COMPLETED
    assert (status.counts.completed, status.counts.failed, status.counts.total) == (11, 0, 11)
    outputs, errors = batches.results(batch_id)
    assert custom_ids(outputs) == [f"line-{i}" for i in range(10)] + ["line-c"]
    assert errors == []
    first, last = orjson.loads(outputs[0]), orjson.loads(outputs[-1])
    assert first["response"]["status_code"] == 200
    assert first["response"]["body"]["choices"][0]["message"]["content"] == "t0t1t2"
    assert last["response"]["body"]["choices"][0]["text"] == "t0t1t2"
    assert last["response"]["body"]["object"] == "text_completion"


def test_fan_out_keeps_to_the_in_flight_cap_and_the_batch_priority(
    make_batches: Callable[..., Batches],
) -> None:
    batches = make_batches(batch_max_in_flight=3)
    batch_id = batches.submit(jsonl(10), priority="high")
    m = store.meta(batches.ctx, batch_id)
    assert driver.fan_out(batches.ctx, batch_id, m) == 3
    assert driver.fan_out(batches.ctx, batch_id, store.meta(batches.ctx, batch_id)) == 0
    status = batches.status(batch_id)
    assert (status.submitted, status.counts.in_flight, status.priority) == (3, 3, 75)
    client = Client(connection=batches.ctx.redis)
    pending = text(batches.ctx.redis.hget(batches.ctx.bkeys.pending(batch_id), "line-0"))
    assert client.handle(pending.split(":")[1]).status().priority == 75


def test_a_batchs_lines_run_as_its_tenant_whatever_they_claim(
    make_batches: Callable[..., Batches],
) -> None:
    batches = make_batches()
    line = orjson.loads(jsonl(1))
    line["body"]["metadata"] = {"tenant": "someone-else", "note": "kept"}
    batch_id = batches.submit([line], tenant="acme")
    driver.fan_out(batches.ctx, batch_id, store.meta(batches.ctx, batch_id))
    pending = text(batches.ctx.redis.hget(batches.ctx.bkeys.pending(batch_id), "line-0"))
    request_id = pending.split(":")[1]
    payload = orjson.loads(
        text(batches.ctx.redis.hget(batches.ctx.keys.request(request_id), "payload"))
    )
    assert payload["tenant"] == "acme" and payload["metadata"]["note"] == "kept"
    assert Client(connection=batches.ctx.redis).handle(request_id).status().tenant == "acme"
    assert batches.status(batch_id, scope="acme").tenant == "acme"
    with pytest.raises(NotFound, match="does not exist"):
        batches.status(batch_id, scope="beta")
    assert [b.id for b in batches.list(scope="acme")] == [batch_id]
    assert batches.list(scope="beta") == []


def test_a_full_queue_makes_the_batch_wait_and_then_continue(
    make_batches: Callable[..., Batches], tokenq_worker: Callable[..., WorkerService]
) -> None:
    settings = Settings(max_queued=2)
    batches = make_batches(settings, batch_max_in_flight=100)
    batch_id = batches.submit(jsonl(9))
    m = store.meta(batches.ctx, batch_id)
    assert driver.fan_out(batches.ctx, batch_id, m) == 2  # the queue bound, not the cap
    drive(batches, batch_id, tokenq_worker(settings))
    outputs, errors = batches.results(batch_id)
    assert (len(outputs), errors) == (9, [])


def test_lines_enqueued_again_after_a_crash_run_once(
    make_batches: Callable[..., Batches], tokenq_worker: Callable[..., WorkerService]
) -> None:
    batches = make_batches()
    batch_id = batches.submit(jsonl(4))
    m = store.meta(batches.ctx, batch_id)
    driver.fan_out(batches.ctx, batch_id, m)
    first = batches.ctx.redis.hgetall(batches.ctx.bkeys.pending(batch_id))
    # A driver that died before recording its progress enqueues the same lines again.
    batches.ctx.redis.delete(batches.ctx.bkeys.pending(batch_id))
    driver.fan_out(batches.ctx, batch_id, m)
    assert batches.ctx.redis.hgetall(batches.ctx.bkeys.pending(batch_id)) == first
    worker = tokenq_worker()
    drive(batches, batch_id, worker)
    assert len(worker.engine.added) == 4  # type: ignore[attr-defined]


def test_cancel_removes_queued_lines_at_once_and_keeps_finished_results(
    make_batches: Callable[..., Batches], tokenq_worker: Callable[..., WorkerService]
) -> None:
    batches = make_batches(batch_max_in_flight=2)
    batch_id = batches.submit(jsonl(6))
    worker = tokenq_worker()
    driver.fan_out(batches.ctx, batch_id, store.meta(batches.ctx, batch_id))
    worker.run(burst=True)
    collect(batches.ctx, batch_id)
    driver.fan_out(batches.ctx, batch_id, store.meta(batches.ctx, batch_id))
    pending = batches.ctx.redis.hvals(batches.ctx.bkeys.pending(batch_id))
    queued = [text(v).split(":")[1] for v in pending]
    assert batches.cancel(batch_id).state is BatchState.CANCELLING
    client = Client(connection=batches.ctx.redis)
    assert [client.handle(r).status().state for r in queued] == [RequestState.CANCELLED] * 2
    drive(batches, batch_id, None)
    assert batches.status(batch_id).state is BatchState.CANCELLED
    outputs, errors = batches.results(batch_id)
    assert custom_ids(outputs) == ["line-0", "line-1"]
    codes = [orjson.loads(e)["error"]["code"] for e in errors]
    assert codes == ["cancelled", "cancelled", "batch_cancelled", "batch_cancelled"]
    assert batches.cancel(batch_id).state is BatchState.CANCELLED  # a no-op once ended


def test_a_driver_that_was_replaced_stands_down(make_batches: Callable[..., Batches]) -> None:
    batches = make_batches()
    batch_id = batches.submit(jsonl(2))
    old = store.meta(batches.ctx, batch_id)["driver"]
    new = batches.resume(batch_id)
    assert new != old
    assert driver.run_tick(batches.ctx, batch_id, old) is True
    assert batches.status(batch_id).submitted == 0


def test_lines_can_be_given_as_dicts(
    make_batches: Callable[..., Batches], tokenq_worker: Callable[..., WorkerService]
) -> None:
    batches = make_batches()
    lines = [{"custom_id": "a", "body": {"prompt": "hi", "max_tokens": 1}}]
    batch_id = batches.submit(lines, model="m", priority=10)
    drive(batches, batch_id, tokenq_worker())
    (output,) = batches.results(batch_id)[0]
    assert orjson.loads(output)["response"]["body"]["choices"][0]["text"] == "t0"
    assert batches.status(batch_id).priority == 10


def chat_body(**fields: object) -> dict[str, object]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 3, **fields}


def payload(batches: Batches, request_id: str) -> dict[str, Any]:
    raw = batches.ctx.redis.hget(batches.ctx.keys.request(request_id), "payload")
    data: dict[str, Any] = orjson.loads(text(raw))
    return data


def pending_ids(batches: Batches, batch_id: str, custom_id: str) -> list[str]:
    value = text(batches.ctx.redis.hget(batches.ctx.bkeys.pending(batch_id), custom_id))
    return value.split(":")[1].split(",")


def test_a_bad_line_goes_to_the_error_file_and_an_n_line_gets_n_choices(
    make_batches: Callable[..., Batches], tokenq_worker: Callable[..., WorkerService]
) -> None:
    batches = make_batches()
    lines = [
        {"custom_id": "bad", "body": chat_body(temperature=-1)},
        {"custom_id": "many", "body": chat_body(n=2, seed=5)},
        {"custom_id": "one", "body": chat_body()},
    ]
    batch_id = batches.submit(lines)
    worker = tokenq_worker()
    drive(batches, batch_id, worker)
    status = batches.status(batch_id)
    assert (status.state, status.counts.completed, status.counts.failed) == (
        BatchState.COMPLETED,
        2,
        1,
    )
    outputs, errors = batches.results(batch_id)
    assert custom_ids(outputs) == ["many", "one"]
    many, one = (orjson.loads(o)["response"] for o in outputs)
    contents = [(c["index"], c["message"]["content"]) for c in many["body"]["choices"]]
    assert contents == [(0, "t0t1t2"), (1, "t0t1t2")]
    single = one["body"]["usage"]
    assert many["body"]["usage"] == {
        "prompt_tokens": single["prompt_tokens"],
        "completion_tokens": 6,
        "total_tokens": single["prompt_tokens"] + 6,
    }
    choice_ids = many["request_id"].split(",")
    assert [payload(batches, r)["sampling"]["seed"] for r in choice_ids] == [5, 6]
    assert len(worker.engine.added) == 3  # type: ignore[attr-defined]
    (error,) = (orjson.loads(e) for e in errors)
    assert (error["custom_id"], error["response"]["status_code"]) == ("bad", 400)
    assert "temperature: Input should be greater than or equal to 0" in error["error"]["message"]


def test_cancelling_a_batch_cancels_every_choice_of_its_lines(
    make_batches: Callable[..., Batches],
) -> None:
    batches = make_batches()
    batch_id = batches.submit([{"custom_id": "many", "body": chat_body(n=3)}])
    driver.fan_out(batches.ctx, batch_id, store.meta(batches.ctx, batch_id))
    ids = pending_ids(batches, batch_id, "many")
    assert len(ids) == 3
    batches.cancel(batch_id)
    client = Client(connection=batches.ctx.redis)
    assert [client.handle(r).status().state for r in ids] == [RequestState.CANCELLED] * 3
    drive(batches, batch_id, None)
    (error,) = batches.results(batch_id)[1]
    assert orjson.loads(error)["error"]["code"] == "cancelled"


def test_a_line_whose_choices_partly_fit_the_queue_is_sent_again_whole(
    make_batches: Callable[..., Batches], tokenq_worker: Callable[..., WorkerService]
) -> None:
    settings = Settings(max_queued=2)
    batches = make_batches(settings)
    batch_id = batches.submit([{"custom_id": "many", "body": chat_body(n=3)}])
    assert driver.fan_out(batches.ctx, batch_id, store.meta(batches.ctx, batch_id)) == 0
    first = pending_ids(batches, batch_id, "many")
    assert len(first) == 2  # recorded, so a cancel would find them
    drive(batches, batch_id, tokenq_worker(settings))
    (output,) = batches.results(batch_id)[0]
    response = orjson.loads(output)["response"]
    assert response["request_id"].split(",")[:2] == first
    assert [c["index"] for c in response["body"]["choices"]] == [0, 1, 2]


def test_a_line_partly_sent_when_the_batch_is_cancelled_ends_as_an_error(
    make_batches: Callable[..., Batches],
) -> None:
    batches = make_batches(Settings(max_queued=1))
    batch_id = batches.submit([{"custom_id": "many", "body": chat_body(n=2)}])
    driver.fan_out(batches.ctx, batch_id, store.meta(batches.ctx, batch_id))
    (sent,) = pending_ids(batches, batch_id, "many")
    batches.cancel(batch_id)
    drive(batches, batch_id, None)
    assert Client(connection=batches.ctx.redis).handle(sent).status().state is (
        RequestState.CANCELLED
    )
    (error,) = batches.results(batch_id)[1]
    assert orjson.loads(error)["error"]["code"] == "batch_cancelled"


def test_a_logprobs_line_is_rendered_from_its_requests_stream(
    make_batches: Callable[..., Batches], tokenq_worker: Callable[..., WorkerService]
) -> None:
    batches = make_batches()
    body = chat_body(logprobs=True, top_logprobs=2)
    batch_id = batches.submit([{"custom_id": "lp", "body": body}])
    drive(batches, batch_id, tokenq_worker())
    (output,) = batches.results(batch_id)[0]
    (choice,) = orjson.loads(output)["response"]["body"]["choices"]
    # The scripted engine computes no logprobs; the text comes from the stream's events.
    assert (choice["message"]["content"], choice["logprobs"]) == ("t0t1t2", {"content": []})


def test_a_lines_stream_is_read_past_entries_that_do_not_parse(
    make_batches: Callable[..., Batches],
    tokenq_worker: Callable[..., WorkerService],
    caplog: pytest.LogCaptureFixture,
) -> None:
    batches = make_batches()
    batch_id = batches.submit([{"custom_id": "lp", "body": chat_body(logprobs=True)}])
    drive(batches, batch_id, tokenq_worker())
    (output,) = batches.results(batch_id)[0]
    request_id = orjson.loads(output)["response"]["request_id"]
    key = batches.ctx.keys.stream(request_id)
    for bad in (b"not json", b'{"type":"token","index":"x"}', b'{"type":"final"}'):
        batches.ctx.main.xadd(key, {"e": bad})
    result = Client(connection=batches.ctx.main).handle(request_id).result(timeout=5)
    (entries,) = collect_streams(batches.ctx, [result])
    assert len(entries) == batches.ctx.main.xlen(key) - 3
    assert entries[-1].type == "final" and "".join(e.text for e in entries) == "t0t1t2"
    assert sum("skipping unreadable entry" in r.getMessage() for r in caplog.records) == 3
