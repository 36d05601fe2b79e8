"""What every `tokenq` command shares: the Redis option and where settings come from."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import redis
import typer
from rich.console import Console

from producer.embedded import up_state_file
from shared.errors import TokenqError
from shared.settings import Settings

RedisOpt = Annotated[
    str | None,
    typer.Option(
        "--redis", help="Redis URL (default: TOKENQ_REDIS_URL, else a running `tokenq up`)"
    ),
]


def settings_for(redis_url: str | None) -> Settings:
    """Settings with the Redis URL from the flag, the environment, or `tokenq up`."""
    env = Settings()
    if redis_url:
        return Settings(redis_url=redis_url)
    if "TOKENQ_REDIS_URL" in os.environ:
        return env
    state = up_state_file()
    if state.exists():
        return Settings(redis_url=state.read_text().strip())
    return env


@contextmanager
def cli_errors(console: Console) -> Iterator[None]:
    """Turn tokenq and connection errors into one red line and exit code 1."""
    try:
        yield
    except (TokenqError, redis.ConnectionError) as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(1) from e
