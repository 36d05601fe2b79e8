"""Webhook deliveries against a loopback receiver, attempt by attempt (no RQ worker)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from producer.batch import webhooks
from producer.batch.ops import Batches
from producer.batch.signing import verify
from producer.batch.webhooks import DeliveryState, WebhookFailed, WebhookNotConfigured
from shared.errors import InvalidRequest, NotFound
from tests.producer.batch.conftest import SECRET, jsonl
from tests.producer.batch.receiver import receiver


def test_a_delivery_is_created_once_and_queued_for_rq(make_batches: Callable[..., Batches]) -> None:
    ctx = make_batches().ctx
    assert webhooks.send(ctx, "d1", "http://127.0.0.1:9/hook", "batch.completed", {"n": 1})
    assert not webhooks.send(ctx, "d1", "http://127.0.0.1:9/hook", "batch.completed", {"n": 2})
    assert ctx.webhook_queue().count == 1
    delivery = webhooks.get(ctx, "d1")
    assert (delivery.state, delivery.attempts, delivery.event) == (
        DeliveryState.PENDING,
        0,
        "batch.completed",
    )


def test_failed_attempts_are_recorded_then_listed_and_sent_again(
    make_batches: Callable[..., Batches],
) -> None:
    ctx = make_batches().ctx
    with receiver(answers=[500, 302]) as hook:
        webhooks.send(ctx, "d1", hook.url, "request.finished", {"x": 1})
        with pytest.raises(WebhookFailed, match="answered HTTP 500"):
            webhooks.deliver(ctx, "d1", last_attempt=False)
        assert webhooks.list_deliveries(ctx, failed_only=True) == []
        with pytest.raises(WebhookFailed, match="answered HTTP 302"):  # redirects are not followed
            webhooks.deliver(ctx, "d1", last_attempt=True)
        (failed,) = webhooks.list_deliveries(ctx, failed_only=True)
        assert (failed.id, failed.state, failed.attempts) == ("d1", DeliveryState.FAILED, 2)
        webhooks.redeliver(ctx, "d1")
        assert webhooks.list_deliveries(ctx, failed_only=True) == []
        assert webhooks.deliver(ctx, "d1", last_attempt=False) is DeliveryState.DELIVERED
        assert webhooks.deliver(ctx, "d1", last_attempt=False) is DeliveryState.DELIVERED
    assert [c.answered for c in hook.calls] == [500, 302, 200]  # nothing after it was accepted
    last = hook.calls[-1]
    verify(
        SECRET, last.body, last.headers["X-Tokenq-Timestamp"], last.headers["X-Tokenq-Signature"]
    )
    assert last.headers["X-Tokenq-Event"] == "request.finished"


def test_an_unreachable_receiver_is_a_failed_attempt(make_batches: Callable[..., Batches]) -> None:
    ctx = make_batches().ctx
    with receiver() as hook:
        url = hook.url
    webhooks.send(ctx, "d1", url, "batch.completed", {})
    with pytest.raises(WebhookFailed, match="could not connect"):
        webhooks.deliver(ctx, "d1", last_attempt=True)
    assert webhooks.get(ctx, "d1").state is DeliveryState.FAILED


def test_webhooks_need_a_secret_and_an_http_url(make_batches: Callable[..., Batches]) -> None:
    batches = make_batches(webhook_secret=None)
    with pytest.raises(WebhookNotConfigured, match="TOKENQ_WEBHOOK_SECRET"):
        batches.submit(jsonl(1), webhook_url="http://127.0.0.1:9/hook")
    with pytest.raises(InvalidRequest, match="absolute http"):
        make_batches().submit(jsonl(1), webhook_url="ftp://example.com/x")
    webhooks.send(batches.ctx, "d1", "http://127.0.0.1:9/hook", "batch.completed", {})
    with pytest.raises(WebhookFailed, match="signing secret"):
        webhooks.deliver(batches.ctx, "d1", last_attempt=False)
    with pytest.raises(NotFound, match="delivery d2 does not exist"):
        webhooks.redeliver(batches.ctx, "d2")
