"""An idempotency key binds its body: the digest (shared.idempotency) and admit.lua's
check of it, against fakeredis, a real redis-server and a real Redis Cluster."""

from __future__ import annotations

from typing import Any

import pytest

from producer.client import Client
from shared.errors import IdempotencyKeyReused, QueueFull
from shared.idempotency import body_digest
from shared.keys import Keys, idempotency_digest, model_tag
from shared.models import GenerationRequest
from tests.conftest import as_tenant

MODEL = "SmolLM2-135M-Instruct"
QUEUE = Keys().queue(model_tag(MODEL))


def request(**fields: Any) -> GenerationRequest:
    return GenerationRequest.model_validate({"model": MODEL, "prompt": "a", **fields})


def test_what_a_submitter_sends_is_bound() -> None:
    base = body_digest(request())
    for changed in (
        request(prompt="b"),
        request(priority="high"),
        request(sampling={"max_tokens": 8}),
        request(sampling={"stop": ["x"]}),
        request(metadata={"order": 17}),
        request(lora="ad"),
        request(model="other"),
    ):
        assert body_digest(changed) != base, changed


def test_what_varies_from_send_to_send_or_is_the_gateways_is_not() -> None:
    base = body_digest(request())
    for same in (
        request(idempotency_key="k"),
        request(deadline_ms=1_700_000_000_000),
        request(tenant="acme", tenant_weight=2),
        request(metadata={"tenant": "acme", "tenant_weight": 2}),
        request(sampling={"max_tokens": 256, "temperature": 1.0}),  # the defaults, stated
        request(metadata={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}),
    ):
        assert body_digest(same) == base, same


def test_the_same_key_and_body_answer_the_original(client: Client) -> None:
    first = client.submit("a", idempotency_key="order-17", deadline=60)
    again = client.submit("a", idempotency_key="order-17", deadline=90)
    assert again.id == first.id
    assert client.redis.zcard(QUEUE) == 1


def test_the_same_key_with_another_body_is_refused_naming_the_key(client: Client) -> None:
    first = client.submit("a", idempotency_key="order-17")
    with pytest.raises(IdempotencyKeyReused, match="'order-17'") as refused:
        client.submit("b", idempotency_key="order-17")
    assert (refused.value.key, refused.value.request_id) == ("order-17", first.id)
    with pytest.raises(IdempotencyKeyReused):
        client.submit("a", idempotency_key="order-17", max_tokens=8)
    assert client.redis.zcard(QUEUE) == 1
    assert client.submit("a", idempotency_key="order-17").id == first.id  # still bound


def test_one_submit_of_two_bodies_under_one_key_keeps_the_first(client: Client) -> None:
    bodies = [{"model": MODEL, "prompt": p, "idempotency_key": "k"} for p in ("a", "b")]
    with pytest.raises(IdempotencyKeyReused):
        client.submit_many(bodies)
    assert client.redis.zcard(QUEUE) == 1
    assert client.submit("a", idempotency_key="k").id == client.submit("a", idempotency_key="k").id


def test_tenants_keys_do_not_meet(client: Client) -> None:
    acme = as_tenant(client, "acme").submit("a", idempotency_key="k")
    beta = as_tenant(client, "beta").submit("b", idempotency_key="k")
    assert acme.id != beta.id
    with pytest.raises(IdempotencyKeyReused):
        as_tenant(client, "acme").submit("b", idempotency_key="k")


def test_a_key_kept_without_its_body_answers_any_body(client: Client) -> None:
    # Accepted before bodies were bound: only the key is there.
    first = client.submit("a", idempotency_key="order-17")
    digest = idempotency_digest(MODEL, "order-17")
    assert client.redis.delete(client.keys.idempotency_body(digest)) == 1
    assert client.submit("b", idempotency_key="order-17").id == first.id


def test_a_refused_submit_leaves_its_key_free_for_another_body(client: Client) -> None:
    for i in range(client.settings.max_queued):
        client.submit(f"x{i}")
    with pytest.raises(QueueFull):
        client.submit("a", idempotency_key="order-17")
    digest = idempotency_digest(MODEL, "order-17")
    assert client.redis.exists(client.keys.idempotency_body(digest)) == 0
    client.redis.delete(QUEUE)  # room again
    assert client.submit("b", idempotency_key="order-17").status().state.value == "queued"
