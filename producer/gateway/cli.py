"""``tokenq gateway``: serve the HTTP gateway under uvicorn."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
import uvicorn

from producer.cli import settings_for
from producer.gateway.app import create_app
from producer.gateway.config import GatewayConfig, load_api_keys


def gateway(
    redis_url: Annotated[
        str | None,
        typer.Option(
            "--redis", help="Redis URL (default: TOKENQ_REDIS_URL, else a running `tokenq up`)"
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR")] = "INFO",
    access_log: Annotated[bool, typer.Option(help="log every HTTP request")] = False,
) -> None:
    """Serve the OpenAI-compatible and native HTTP API (API keys from TOKENQ_API_KEYS)."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    app = create_app(settings_for(redis_url), GatewayConfig(api_keys=load_api_keys()))
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), access_log=access_log)


def main() -> None:
    typer.run(gateway)


if __name__ == "__main__":
    main()
