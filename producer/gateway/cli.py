"""``tokenq gateway``: serve the HTTP gateway under uvicorn.

The web stack is imported when the command runs, not when the CLI loads.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from producer.gateway.config import GatewayConfig
    from shared.settings import Settings

APP_FACTORY = "producer.gateway.cli:serving_app"


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
    workers: Annotated[int, typer.Option(min=1, help="gateway processes on this port")] = 1,
    max_body_bytes: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="refuse larger request bodies with 413 (default: "
            "TOKENQ_GATEWAY_MAX_BODY_BYTES, else 8 MiB)",
        ),
    ] = None,
) -> None:
    """Serve the OpenAI-compatible and native HTTP API (API keys from TOKENQ_API_KEYS)."""
    import uvicorn

    from producer.api_keys import load_api_keys
    from producer.cli_options import settings_for
    from producer.gateway.config import GatewayConfig
    from shared.errors import InvalidRequest

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = settings_for(redis_url)
    max_body_bytes = max_body_bytes or settings.gateway_max_body_bytes
    try:
        config = GatewayConfig(api_keys=load_api_keys(settings), max_body_bytes=max_body_bytes)
    except InvalidRequest as e:
        raise typer.BadParameter(str(e), param_hint="TOKENQ_API_KEYS") from e
    serve = partial(
        uvicorn.run, host=host, port=port, log_level=log_level.lower(), access_log=access_log
    )
    if workers == 1:
        serve(serving_app(settings, config))
        return
    # Each worker process builds its own app from the environment, so pass the URL on.
    os.environ["TOKENQ_REDIS_URL"] = settings.redis_url
    os.environ["TOKENQ_GATEWAY_MAX_BODY_BYTES"] = str(max_body_bytes)
    serve(APP_FACTORY, factory=True, workers=workers)


def serving_app(settings: Settings | None = None, config: GatewayConfig | None = None) -> Any:
    """The app, built and then frozen out of the collector's view; with no arguments
    (each of ``--workers`` processes) from the environment."""
    from producer.gateway.app import create_app
    from shared.gc_policy import freeze_startup_objects

    app = create_app(settings, config)
    freeze_startup_objects()
    return app


def main() -> None:
    typer.run(gateway)


if __name__ == "__main__":
    main()
