"""Usage per tenant per UTC hour: prompt tokens, generated tokens and requests.

A worker adds a request's usage (the final event's, what its client was told) once
its finish went through, in the round trip that settles it; each hour is one hash
(``Keys.usage``) that expires after ``Settings.usage_retention_s``. Requests that end
without running (cancelled or expired while queued) used nothing and count nowhere.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from shared.keys import Keys
from shared.models import Usage
from shared.replies import text
from shared.scripts import ScriptCall
from shared.settings import Settings

NO_TENANT = "default"  # requests submitted without a tenant (an open gateway's name too)
KINDS = ("prompt", "completion", "requests")


def hour_of(unix_s: float) -> int:
    """Hours since the epoch: the usage key's hour."""
    return int(unix_s // 3600)


def record_call(
    keys: Keys,
    settings: Settings,
    used: Sequence[tuple[str | None, Usage]],
    now_s: float | None = None,
) -> ScriptCall:
    """usage.lua: each (tenant, usage) added to the current hour (summed per tenant
    first: three counters per tenant, however many of its requests ended)."""
    key = keys.usage(hour_of(time.time() if now_s is None else now_s))
    sums: dict[str, list[int]] = {}
    for tenant, u in used:
        row = sums.setdefault(tenant or NO_TENANT, [0, 0, 0])
        row[0] += u.prompt_tokens
        row[1] += u.completion_tokens
        row[2] += 1
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

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


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
    prompt, completion = counts.get("prompt", 0), counts.get("completion", 0)
    return TenantUsage(tenant, hour, prompt, completion, counts.get("requests", 0))


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
        )
    return sorted(by_tenant.values(), key=lambda u: (-u.total_tokens, u.tenant))
