"""Usage per tenant per hour (shared.usage, usage.lua) against fakeredis, a real
redis-server and a real Redis Cluster."""

from __future__ import annotations

import redis

from shared.keys import Keys
from shared.models import Usage
from shared.scripts import Scripts
from shared.settings import Settings
from shared.usage import (
    NO_TENANT,
    TenantUsage,
    Used,
    hour_of,
    last_hours,
    read_usage,
    record_call,
    totals,
)

NOW_S = 1_800_000_000.0


def read(r: redis.Redis, hours: list[int]) -> list[TenantUsage]:
    return read_usage(r, Keys(), hours)


def test_usage_adds_up_per_tenant_and_hour_and_expires(any_redis: redis.Redis) -> None:
    settings = Settings(usage_retention_s=7200)
    scripts = Scripts(any_redis)
    used = [("acme", Usage(prompt_tokens=5, completion_tokens=7)), (None, Usage(prompt_tokens=1))]
    scripts.run(record_call(Keys(), settings, used, NOW_S))
    scripts.run(record_call(Keys(), settings, [("acme", Usage(completion_tokens=3))], NOW_S))
    scripts.run(record_call(Keys(), settings, [("acme", Usage(prompt_tokens=2))], NOW_S + 3600))
    hours = last_hours(3, NOW_S + 3600)
    rows = read(any_redis, hours)
    hour = hour_of(NOW_S)
    assert rows == [
        TenantUsage("acme", hour, 5, 10, 2),
        TenantUsage(NO_TENANT, hour, 1, 0, 1),
        TenantUsage("acme", hour + 1, 2, 0, 1),
    ]
    assert totals(rows)[0] == TenantUsage("acme", hour + 1, 7, 10, 3)
    assert 0 < any_redis.ttl(Keys().usage(hour)) <= 7200


def test_prefix_cache_figures_add_up_per_tenant(any_redis: redis.Redis) -> None:
    scripts = Scripts(any_redis)
    used: list[Used | tuple[str, Usage]] = [
        Used("acme", Usage(prompt_tokens=100), 100, 64),
        Used("acme", Usage(prompt_tokens=50), 50, 0),
        ("beta", Usage(prompt_tokens=8)),  # a worker that reports none
    ]
    scripts.run(record_call(Keys(), Settings(), used, NOW_S))
    acme, beta = totals(read(any_redis, [hour_of(NOW_S)]))
    assert (acme.cache_queried_tokens, acme.cache_hit_tokens) == (150, 64)
    assert round(acme.cache_hit_rate, 3) == 0.427
    assert (beta.cache_queried_tokens, beta.cache_hit_rate) == (0, 0.0)
