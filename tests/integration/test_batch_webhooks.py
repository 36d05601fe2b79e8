"""Signed webhooks from real RQ worker processes to a loopback receiver: retries with
backoff, exactly one accepted delivery, failures listed and sent again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from producer.batch import webhooks
from producer.batch.models import BatchState
from producer.batch.ops import Batches
from producer.batch.signing import BadSignature, verify
from producer.batch.watch import submit_with_webhook
from producer.batch.webhooks import DeliveryState
from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.settings import Settings
from tests.conftest import serve
from tests.producer.batch.conftest import MODEL, jsonl
from tests.producer.batch.procs import SECRET, RqWorkers, rq_batch_settings, tokenq_worker, wait_for
from tests.producer.batch.receiver import Call, receiver

pytestmark = pytest.mark.integration


@pytest.fixture
def rq_workers(redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[RqWorkers]:
    workers = RqWorkers(redis_server.url, tmp_path)
    workers.start()  # with RQ's scheduler, which runs retries after their backoff
    yield workers
    workers.stop_all()


@pytest.fixture
def client(redis_server: EmbeddedRedis, real_redis: redis.Redis) -> Client:
    serve(real_redis, MODEL)
    return Client(connection=real_redis, settings=Settings(redis_url=redis_server.url))


def assert_signed(call: Call) -> None:
    h = call.headers
    verify(SECRET, call.body, h["X-Tokenq-Timestamp"], h["X-Tokenq-Signature"])
    with pytest.raises(BadSignature):
        verify("not-the-secret", call.body, h["X-Tokenq-Timestamp"], h["X-Tokenq-Signature"])


def nothing_left_to_send(real_redis: redis.Redis) -> bool:
    """No delivery job queued, waiting for its backoff, or running."""
    queue = Queue("tokenq-webhooks", connection=real_redis, serializer=JSONSerializer)
    registries = (queue.scheduled_job_registry, queue.started_job_registry)
    return queue.count == 0 and all(r.count == 0 for r in registries)


def test_a_batch_webhook_is_retried_until_accepted_once(
    client: Client, rq_workers: RqWorkers, redis_server: EmbeddedRedis, real_redis: redis.Redis
) -> None:
    batches = Batches(client, rq_batch_settings())
    with receiver(answers=[500, 500]) as hook, tokenq_worker(redis_server.url, MODEL):
        batch_id = batches.submit(jsonl(3), webhook_url=hook.url)
        calls = hook.wait_for_calls(3, timeout_s=30)
        wait_for(lambda: nothing_left_to_send(real_redis), 10, "the delivery jobs to end")
    assert [c.answered for c in hook.calls] == [500, 500, 200]
    assert len(hook.accepted()) == 1
    for call in calls:
        assert_signed(call)
    assert {c.headers["X-Tokenq-Delivery"] for c in calls} == {batch_id}
    body = orjson.loads(calls[-1].body)
    assert body["type"] == "batch.completed"
    assert body["data"]["batch"]["state"] == BatchState.COMPLETED
    assert body["data"]["batch"]["counts"]["completed"] == 3
    delivery = webhooks.get(batches.ctx, batch_id)
    assert (delivery.state, delivery.attempts, delivery.last_status) == (
        DeliveryState.DELIVERED,
        3,
        200,
    )


def test_a_delivery_whose_retries_ran_out_is_listed_and_can_be_sent_again(
    client: Client, rq_workers: RqWorkers, redis_server: EmbeddedRedis
) -> None:
    batches = Batches(client, rq_batch_settings())
    with receiver(answers=[503, 503, 503]) as hook, tokenq_worker(redis_server.url, MODEL):
        batch_id = batches.submit(jsonl(1), webhook_url=hook.url)
        hook.wait_for_calls(3, timeout_s=30)
        failed = wait_for(
            lambda: webhooks.list_deliveries(batches.ctx, failed_only=True),
            10,
            "the delivery to be listed as failed",
        )
        assert [(d.id, d.state, d.attempts) for d in failed] == [
            (batch_id, DeliveryState.FAILED, 3)
        ]
        assert failed[0].last_error == "answered HTTP 503"
        webhooks.redeliver(batches.ctx, batch_id)
        hook.wait_for_calls(4, timeout_s=10)
    assert [c.answered for c in hook.calls] == [503, 503, 503, 200]
    assert webhooks.list_deliveries(batches.ctx, failed_only=True) == []
    wait_for(
        lambda: webhooks.get(batches.ctx, batch_id).state is DeliveryState.DELIVERED,
        10,
        "the delivery to be marked delivered",
    )


def test_a_request_with_a_webhook_reports_its_result(
    client: Client, rq_workers: RqWorkers, redis_server: EmbeddedRedis
) -> None:
    with receiver() as hook, tokenq_worker(redis_server.url, MODEL):
        request = {"model": MODEL, "prompt": "hello", "sampling": {"max_tokens": 2}}
        handle = submit_with_webhook(client, request, hook.url, rq_batch_settings())
        (call,) = hook.wait_for_calls(1, timeout_s=30)
    assert_signed(call)
    body = orjson.loads(call.body)
    assert (body["type"], body["data"]["request_id"]) == ("request.finished", handle.id)
    assert body["data"]["result"]["text"] == "t0t1"
    assert handle.status().state == "finished"
