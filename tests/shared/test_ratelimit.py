"""Rate limits per API key (shared.ratelimit, ratelimit.lua) against fakeredis, a real
redis-server and a real Redis Cluster; and a Python client carrying a key."""

from __future__ import annotations

import orjson
import pytest
import redis

from producer.client import Client
from shared.errors import RateLimited
from shared.flows import drive
from shared.keys import Keys
from shared.models import GenerationRequest, RequestState
from shared.ratelimit import (
    Limits,
    Verdict,
    admit_flow,
    duration_text,
    headers,
    request_tokens,
    retry_after_header,
)
from shared.scripts import Scripts
from shared.settings import Settings
from tests.conftest import serve

MODEL = "m"
REQ = GenerationRequest(model=MODEL, prompt="x" * 40, sampling={"max_tokens": 90})  # 100 tokens


def admit(r: redis.Redis, limits: Limits, req: GenerationRequest = REQ) -> Verdict:
    verdict, _ = drive(Scripts(r), admit_flow(Keys(), Settings(), "bkt", limits, req))
    return verdict


def test_requests_per_minute_admits_the_limit_then_says_when_to_retry(
    any_redis: redis.Redis,
) -> None:
    limits = Limits(requests_per_min=10)
    verdicts = [admit(any_redis, limits) for _ in range(12)]
    assert [v.verdict for v in verdicts] == ["ok"] * 10 + ["requests"] * 2
    assert [v.remaining_requests for v in verdicts[:10]] == list(range(9, -1, -1))
    refused = verdicts[10]
    assert 5_000 < refused.retry_after_ms <= 6_000  # one slot frees every 6 s
    assert refused.limit_requests == 10 and refused.remaining_requests == 0
    assert 59_000 < refused.reset_requests_ms <= 60_000


def test_tokens_per_minute_counts_prompt_and_max_tokens(any_redis: redis.Redis) -> None:
    assert request_tokens(REQ) == 100
    limits = Limits(tokens_per_min=250)
    verdicts = [admit(any_redis, limits).verdict for _ in range(3)]
    assert verdicts == ["ok", "ok", "tokens"]
    big = GenerationRequest(model=MODEL, prompt="x", sampling={"max_tokens": 300})
    assert admit(any_redis, limits, big).verdict == "too_large"


def test_a_refusal_charges_no_limit(any_redis: redis.Redis) -> None:
    limits = Limits(requests_per_min=100, tokens_per_min=150)
    assert admit(any_redis, limits).verdict == "ok"
    assert admit(any_redis, limits).verdict == "tokens"
    again = admit(any_redis, limits)
    assert (again.verdict, again.remaining_requests) == ("tokens", 99)  # refusals took none


def test_concurrent_places_free_up_when_requests_end(any_redis: redis.Redis) -> None:
    serve(any_redis, MODEL)
    settings = Settings(
        api_keys=orjson.dumps({"sk-one": {"tenant": "acme", "max_concurrent": 2}}).decode()
    )
    client = Client(connection=any_redis, settings=settings, api_key="sk-one")
    first, _second = client.submit("a", model=MODEL), client.submit("b", model=MODEL)
    with pytest.raises(RateLimited, match="concurrent requests"):
        client.submit("c", model=MODEL)
    assert first.cancel() == "cancelled"
    third = client.submit("c", model=MODEL)
    assert third.status().state is RequestState.QUEUED
    assert third.status().tenant == "acme"


def test_a_client_with_a_key_shares_its_limits_and_says_when_to_retry(
    any_redis: redis.Redis,
) -> None:
    serve(any_redis, MODEL)
    keys = {"sk-two": {"tenant": "beta", "requests_per_min": 3, "weight": 2}}
    settings = Settings(api_keys=orjson.dumps(keys).decode())
    one = Client(connection=any_redis, settings=settings, api_key="sk-two")
    other = Client(connection=any_redis, settings=settings, api_key="sk-two")
    handles = [one.submit("a", model=MODEL), other.submit("b", model=MODEL)]
    handles.append(one.submit("c", model=MODEL))
    with pytest.raises(RateLimited, match="3 requests per minute") as refused:
        other.submit("d", model=MODEL)
    assert refused.value.retry_after_s is not None and 0 < refused.value.retry_after_s <= 20
    assert refused.value.headers["x-ratelimit-remaining-requests"] == "0"
    assert len(handles) == 3


def test_an_unknown_key_is_refused_with_what_to_do(any_redis: redis.Redis) -> None:
    with pytest.raises(ValueError, match="unknown API key"):
        Client(connection=any_redis, settings=Settings(), api_key="sk-nope")


def test_headers_in_openais_form() -> None:
    verdict = Verdict("requests", 1500, 60, 0, 59_000, 1000, 900, 6_000, 0)
    assert headers(verdict) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "59s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "6s",
    }
    assert [duration_text(ms) for ms in (20, 1500, 360_000, 61_250)] == [
        "20ms",
        "1.5s",
        "6m0s",
        "1m1.25s",
    ]
    assert [retry_after_header(s) for s in (0.01, 1.0, 1.2)] == ["1", "1", "2"]
