"""Two gateway processes share one API key's limits through Redis: a burst over the
limit is held to it within 5%, and a refusal's Retry-After is when a retry fits."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest
import redis

from producer.embedded import EmbeddedRedis
from tests.conftest import serve
from tests.producer.gateway.process import gateway_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "m"
KEY = "sk-shared"
LIMIT = 100
BURST = 150
KEYS = orjson.dumps({KEY: {"tenant": "acme", "requests_per_min": LIMIT}}).decode()


def _post(http: httpx.Client) -> httpx.Response:
    body = {"model": MODEL, "prompt": "hi", "sampling": {"max_tokens": 1}}
    return http.post("/v1/requests", json=body, headers={"Authorization": f"Bearer {KEY}"})


def test_two_gateways_hold_a_burst_to_one_keys_limit(
    redis_server: EmbeddedRedis, real_redis: redis.Redis
) -> None:
    serve(real_redis, MODEL)
    with (
        gateway_process(redis_server.url, KEYS) as url_one,
        gateway_process(redis_server.url, KEYS) as url_two,
        httpx.Client(base_url=url_one, timeout=30) as one,
        httpx.Client(base_url=url_two, timeout=30) as two,
        ThreadPoolExecutor(8) as pool,
    ):
        started = time.monotonic()
        replies = list(pool.map(_post, [(one, two)[n % 2] for n in range(BURST)]))
        burst_s = time.monotonic() - started
        refused = [r for r in replies if r.status_code == 429]
        accepted = [r for r in replies if r.status_code == 202]
        assert len(accepted) + len(refused) == BURST, {r.status_code for r in replies}
        # A minute's worth at once, plus what the limit lets in while the burst lasts
        # (LIMIT per 60 s), within 5% of the limit.
        allowed = LIMIT * (1 + burst_s / 60)
        assert abs(len(accepted) - allowed) <= 0.05 * LIMIT, (len(accepted), burst_s)
        last = refused[-1]
        assert last.json()["error"]["code"] == "rate_limit_exceeded"
        assert last.headers["x-ratelimit-limit-requests"] == str(LIMIT)
        assert last.headers["x-ratelimit-remaining-requests"] == "0"
        retry_s = int(last.headers["Retry-After"])
        assert retry_s == 1  # one request's share of a minute (0.6 s), rounded up
        time.sleep(retry_s)
        assert _post(two).status_code == 202  # after Retry-After it fits, on either gateway
