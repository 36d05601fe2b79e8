"""Usage per tenant per UTC hour: prompt tokens, generated tokens and requests, and the
prompt tokens its requests looked up in the prefix cache and found there.

A worker adds a request's usage (the final event's, what its client was told) once
its finish went through, in the round trip that settles it; each hour is one hash
(``Keys.usage``) that expires after ``Settings.usage_retention_s``. Requests that end
without running (cancelled or expired while queued) used nothing and count nowhere.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis
import redis.asyncio

from shared.keys import Keys
from shared.models import Usage
from shared.replies import text
from shared.scripts import ScriptCall
from shared.settings import Settings

NO_TENANT = "default"  # requests submitted without a tenant (an open gateway's name too)
KINDS = ("prompt", "completion", "requests", "cache_queried", "cache_hits")


class Used(NamedTuple):
    """One ended request as its tenant's hour counts it."""

    tenant: str | None
    usage: Usage
    num_prefix_queried_tokens: int = 0
    num_prefix_hit_tokens: int = 0


def hour_of(unix_s: float) -> int:
    """Hours since the epoch: the usage key's hour."""
    return int(unix_s // 3600)


def record_call(
    keys: Keys,
    settings: Settings,
    used: Sequence[Used | tuple[str | None, Usage]],
    now_s: float | None = None,
) -> ScriptCall:
    """usage.lua: each request's usage (a ``Used``, or a (tenant, usage) pair) added to
    the current hour (summed per tenant first: five counters per tenant, however many
    of its requests ended)."""
    key = keys.usage(hour_of(time.time() if now_s is None else now_s))
    sums: dict[str, list[int]] = {}
    for item in used:
        one = item if isinstance(item, Used) else Used(*item)
        row = sums.setdefault(one.tenant or NO_TENANT, [0, 0, 0, 0, 0])
        row[0] += one.usage.prompt_tokens
        row[1] += one.usage.completion_tokens
        row[2] += 1
        row[3] += one.num_prefix_queried_tokens
        row[4] += one.num_prefix_hit_tokens
    args: list[str | int] = []
    for tenant, row in sums.items():
        args += [tenant, *row]
    return ScriptCall("usage", [key], [settings.usage_retention_s, *args])


@dataclass(frozen=True)
class TenantUsage:
    tenant: str
    hour: int  # hours since the epoch, UTC
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    # Prompt tokens looked up in the prefix cache, and of those found cached.
    cache_queried_tokens: int = 0
    cache_hit_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cache_hit_rate(self) -> float:
        """The share of its looked-up prompt tokens found cached, 0..1."""
        return (
            self.cache_hit_tokens / self.cache_queried_tokens if self.cache_queried_tokens else 0.0
        )


def read_usage(r: redis.Redis, keys: Keys, hours: Sequence[int]) -> list[TenantUsage]:
    """The rows of these hours, in one round trip."""
    pipe = r.pipeline(transaction=False)
    for hour in hours:
        pipe.hgetall(keys.usage(hour))
    return parse_usage(hours, pipe.execute())


async def read_usage_async(
    r: redis.asyncio.Redis, keys: Keys, hours: Sequence[int]
) -> list[TenantUsage]:
    pipe = r.pipeline(transaction=False)
    for hour in hours:
        pipe.hgetall(keys.usage(hour))
    return parse_usage(hours, await pipe.execute())


def parse_usage(hours: Sequence[int], replies: list[Any]) -> list[TenantUsage]:
    """One row per tenant and hour that has any usage, oldest hour first, by tenant."""
    rows: list[TenantUsage] = []
    for hour, fields in zip(hours, replies, strict=True):
        counts: dict[str, dict[str, int]] = {}
        for field, value in (fields or {}).items():
            kind, _, tenant = text(field).partition(":")
            if kind in KINDS:
                counts.setdefault(tenant, {})[kind] = int(value)
        rows += [_row(tenant, hour, c) for tenant, c in sorted(counts.items())]
    return rows


def _row(tenant: str, hour: int, counts: dict[str, int]) -> TenantUsage:
    return TenantUsage(tenant, hour, *(counts.get(kind, 0) for kind in KINDS))


def last_hours(num_hours: int, now_s: float | None = None) -> list[int]:
    """The ``num_hours`` hours up to and including the current one, oldest first."""
    now = hour_of(time.time() if now_s is None else now_s)
    return list(range(now - num_hours + 1, now + 1))


def totals(rows: list[TenantUsage]) -> list[TenantUsage]:
    """Rows summed per tenant over their hours (hour: the latest one)."""
    by_tenant: dict[str, TenantUsage] = {}
    for r in rows:
        t = by_tenant.get(r.tenant, TenantUsage(r.tenant, r.hour))
        by_tenant[r.tenant] = TenantUsage(
            r.tenant,
            max(t.hour, r.hour),
            t.prompt_tokens + r.prompt_tokens,
            t.completion_tokens + r.completion_tokens,
            t.requests + r.requests,
            t.cache_queried_tokens + r.cache_queried_tokens,
            t.cache_hit_tokens + r.cache_hit_tokens,
        )
    return sorted(by_tenant.values(), key=lambda u: (-u.total_tokens, u.tenant))
