"""cache_salt through the Python clients' submit: kept with the request (it seeds the
request's prefix fingerprints), a bad one refused with InvalidRequest naming it."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from producer.aio import AsyncClient
from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.errors import InvalidRequest
from shared.keys import model_tag
from shared.models import GenerationRequest
from shared.replies import text
from shared.settings import Settings
from tests.conftest import serve

PROMPT = "You are the assistant of a bank. " * 40  # long enough to be fingerprinted


def stored(r: redis.Redis, client: Client, request_id: str) -> tuple[GenerationRequest, str]:
    """The request as queued, and its first prefix fingerprint."""
    payload = text(r.hget(client.keys.request(request_id), "payload") or b"")
    prefixes = text(r.hget(client.keys.prefixes(model_tag("m")), request_id) or b"")
    return GenerationRequest.model_validate_json(payload), prefixes.split()[0]


def test_submit_keeps_the_cache_salt_and_refuses_a_bad_one(real_redis: redis.Redis) -> None:
    serve(real_redis, "m")
    client = Client(connection=real_redis, settings=Settings())
    plain, plain_fp = stored(real_redis, client, client.submit(PROMPT, model="m").id)
    salted, salted_fp = stored(
        real_redis, client, client.submit(PROMPT, model="m", cache_salt="user-1").id
    )
    assert (plain.cache_salt, salted.cache_salt) == (None, "user-1")
    assert plain_fp != salted_fp
    with pytest.raises(InvalidRequest, match="cache_salt"):
        client.submit(PROMPT, model="m", cache_salt="a\tb")


async def test_the_asyncio_client_takes_it_too(redis_server: EmbeddedRedis) -> None:
    connection = redis.asyncio.Redis.from_url(redis_server.url)
    await connection.flushall()
    serve(redis.Redis.from_url(redis_server.url), "m")
    async with AsyncClient(connection=connection, settings=Settings()) as client:
        handle = await client.submit(PROMPT, model="m", cache_salt="user-1")
        payload = text(await connection.hget(client.keys.request(handle.id), "payload") or b"")
        assert GenerationRequest.model_validate_json(payload).cache_salt == "user-1"
        with pytest.raises(InvalidRequest, match="cache_salt"):
            await client.submit(PROMPT, model="m", cache_salt="")
