"""What every `tokenq` command shares: the Redis option and where settings come from."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn

import redis
import typer
from rich.console import Console

from producer.embedded import up_state_file
from shared.connection import UNREACHABLE, shown_url, unreachable_message
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
def cli_errors(console: Console, redis_url: str | None = None) -> Iterator[None]:
    """Turn tokenq and Redis errors into one red line and exit code 1; a Redis that
    cannot be reached is named by its URL (``redis_url`` is the command's --redis)."""
    try:
        yield
    except TokenqError as e:
        _fail(console, str(e), e)
    except UNREACHABLE as e:
        _fail(console, unreachable_message(settings_for(redis_url).redis_url, e), e)
    except redis.RedisError as e:
        url = shown_url(settings_for(redis_url).redis_url)
        _fail(console, f"Redis at {url} answered with an error: {e}", e)


def _fail(console: Console, message: str, cause: BaseException) -> NoReturn:
    console.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(1) from cause
