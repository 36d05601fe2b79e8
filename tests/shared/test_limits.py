"""What a model's workers register (its limits, whether they serve structured outputs)
and what a submit and a claim make of it, on fakeredis, a real redis-server and a real
Redis Cluster."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio

from producer.aio import AsyncClient
from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.errors import InvalidRequest, MissingCapability
from shared.flows import claim_flow, drive
from shared.keys import Keys, model_tag
from shared.limits import ModelLimits, merged, registered_limits
from shared.models import RequestState
from shared.ops.claim import Claim
from shared.registry import GUIDED_FIELD, LIMITS_FIELD, register_worker
from shared.scripts import Scripts
from shared.settings import DEFAULT_MODEL, Settings

KEYS = Keys()
TAG = model_tag(DEFAULT_MODEL)
LIMITS = ModelLimits(vocab_size=1000, max_model_len=512, embedding_size=64, guided=True)


def register(client: Client, worker_id: str, limits: ModelLimits) -> None:
    register_on(client.redis, worker_id, limits)


def register_on(connection: redis.Redis, worker_id: str, limits: ModelLimits) -> None:
    """What a worker's heartbeat writes."""
    fields: dict[str, Any] = {
        "model": DEFAULT_MODEL,
        GUIDED_FIELD: int(limits.guided),
        LIMITS_FIELD: limits.model_dump_json(),
    }
    pipe = connection.pipeline(transaction=False)
    register_worker(pipe, KEYS, Settings(), worker_id, fields)
    pipe.execute()


def claim(client: Client, guided: bool) -> list[str]:
    c = Claim(TAG, "w", client.settings.lease_ms, 5, 5, max_lora_rank=0, guided=guided)
    return [
        x.request_id
        for x in drive(Scripts(client.redis), claim_flow(KEYS, client.settings, c, cluster=True))
    ]


def test_the_laxest_registered_limits_are_the_models(client: Client) -> None:
    assert registered_limits(client.redis, DEFAULT_MODEL) is None
    narrow = ModelLimits(vocab_size=1000, max_model_len=128, guided=False)
    register(client, "w1", narrow)
    register(client, "w2", LIMITS)
    assert registered_limits(client.redis, DEFAULT_MODEL) == merged([narrow, LIMITS]) == LIMITS


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"prompt_token_ids": [1, 1000]}, "prompt_token_ids: token id 1000 is outside"),
        ({"stop_token_ids": [5000], "min_tokens": 1}, "sampling.stop_token_ids: token id 5000"),
        ({"logit_bias": {"1000": 5}}, "sampling.logit_bias: token id 1000"),
        ({"max_tokens": 512}, "sampling.max_tokens: 512 is past the model's context of 512"),
        ({"prompt_token_ids": [1] * 500, "max_tokens": 20}, "over the model's context of 512"),
    ],
)
def test_a_submit_over_the_registered_limits_is_refused_naming_the_field(
    client: Client, fields: dict[str, Any], says: str
) -> None:
    register(client, "w1", LIMITS)
    prompt = None if "prompt_token_ids" in fields else "hi"
    with pytest.raises(InvalidRequest, match=says):
        client.submit(prompt, **fields)
    assert client.redis.zcard(KEYS.queue(TAG)) == 0
    client.submit("hi", max_tokens=511)  # within them


def test_structured_requests_are_refused_while_no_live_worker_serves_them(
    client: Client,
) -> None:
    client._limits.ttl_s = 0.0  # read each submit: the test changes the workers between them
    client.redis.delete(KEYS.guided_served(TAG))  # the client fixture's mark: any worker's
    register(client, "w1", LIMITS.model_copy(update={"guided": False}))
    with pytest.raises(MissingCapability, match="structured outputs"):
        client.submit("hi", guided_regex="[ab]+")  # the client's own check
    client.redis.delete(KEYS.limits(TAG))  # a worker of before limits: enqueue.lua refuses
    with pytest.raises(MissingCapability, match="structured outputs"):
        client.submit("hi", guided_regex="[ab]+")
    plain = client.submit("hi")
    assert plain.status().state is RequestState.QUEUED
    register(client, "w2", LIMITS)
    structured = client.submit("hi", guided_regex="[ab]+")
    assert structured.status().state is RequestState.QUEUED


def test_a_worker_without_a_grammar_backend_never_claims_a_structured_request(
    client: Client,
) -> None:
    register(client, "w1", LIMITS)
    structured = client.submit("one", guided_json={"type": "object"}, priority="high")
    plain = client.submit("two")
    assert claim(client, guided=False) == [plain.id]
    assert structured.status().state is RequestState.QUEUED
    assert claim(client, guided=False) == []
    assert claim(client, guided=True) == [structured.id]


async def test_the_asyncio_client_refuses_what_the_registered_limits_refuse(
    redis_server: EmbeddedRedis, real_redis: redis.Redis
) -> None:
    register_on(real_redis, "w1", LIMITS)
    connection = redis.asyncio.Redis.from_url(redis_server.url)
    async with AsyncClient(connection=connection, settings=Settings()) as client:
        with pytest.raises(InvalidRequest, match=r"sampling\.max_tokens: 512 is past"):
            await client.submit("hi", max_tokens=512)
        assert (await client.submit("hi", max_tokens=511)).id
