"""``tokenq usage``: prompt and generated tokens and requests per tenant per hour."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from producer.cli_options import RedisOpt, cli_errors, settings_for
from producer.client import Client
from shared.usage import TenantUsage, last_hours, read_usage, totals

console = Console(stderr=True)
out = Console()


def usage(
    redis_url: RedisOpt = None,
    hours: Annotated[int, typer.Option(min=1, help="the last N hours, this one included")] = 24,
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    by_hour: Annotated[bool, typer.Option("--by-hour", help="a row per tenant and hour")] = False,
) -> None:
    """Usage per tenant: prompt tokens, generated tokens, requests and the share of
    prompt tokens found in the prefix cache (UTC hours)."""
    with cli_errors(console, redis_url), Client(settings=settings_for(redis_url)) as client:
        rows = read_usage(client.redis, client.keys, last_hours(hours))
    rows = [r for r in rows if tenant is None or r.tenant == tenant]
    out.print(_table(rows if by_hour else totals(rows), by_hour, hours))


def _table(rows: list[TenantUsage], by_hour: bool, hours: int) -> Table:
    title = f"usage, last {hours} hour{'s' * (hours != 1)} (UTC)"
    table = Table(title=title)
    if by_hour:
        table.add_column("hour")
    names = ("tenant", "prompt tokens", "generated tokens", "total tokens", "requests")
    for name in (*names, "prefix-cache hits"):
        table.add_column(name, justify="left" if name == "tenant" else "right")
    for r in rows:
        figures = (r.prompt_tokens, r.completion_tokens, r.total_tokens, r.requests)
        hour = [hour_text(r.hour)] if by_hour else []
        hits = f"{r.cache_hit_rate:.0%}" if r.cache_queried_tokens else "-"
        table.add_row(*hour, r.tenant, *(f"{n:,}" for n in figures), hits)
    if not rows:
        table.caption = "no usage recorded in this span"
    return table


def hour_text(hour: int) -> str:
    return dt.datetime.fromtimestamp(hour * 3600, dt.UTC).strftime("%Y-%m-%d %H:00")
