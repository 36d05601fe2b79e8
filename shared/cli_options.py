"""What every `tokenq` command shares, the producer's and the worker's: the Redis
option, where settings come from, and the log format."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from shared.settings import Settings

RedisOpt = Annotated[
    str | None,
    typer.Option(
        "--redis", help="Redis URL (default: TOKENQ_REDIS_URL, else a running `tokenq up`)"
    ),
]


def up_state_file() -> Path:
    """Where a running `tokenq up` leaves its Redis URL for the other commands."""
    return Path.home() / ".cache" / "tokenq" / "up.url"


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


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
