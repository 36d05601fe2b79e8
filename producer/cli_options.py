"""What the producer's `tokenq` commands share: one red line for an error (the Redis
option and where settings come from are ``shared.cli_options``, the worker's too)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import redis
import typer
from rich.console import Console

from shared.cli_options import RedisOpt, settings_for
from shared.connection import UNREACHABLE, shown_url, unreachable_message
from shared.errors import TokenqError


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


__all__ = ["RedisOpt", "cli_errors", "settings_for"]
