"""``tokenq dashboard``: serve the admin dashboard alone under uvicorn.

The web stack is imported when the command runs, not when the CLI loads.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import replace
from typing import Annotated

import typer

from producer.cli_options import RedisOpt, settings_for
from producer.dashboard.config import DashboardConfig, load_config

GRACEFUL_SHUTDOWN_S = 5
PREFIX = "/admin"  # where producer.dashboard.app serves it


def dashboard(
    redis_url: RedisOpt = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8001,
    read_only_view: Annotated[
        bool,
        typer.Option(help="let anyone who can reach the page view it (actions need the token)"),
    ] = False,
    sample_interval_s: Annotated[
        float | None, typer.Option(min=0.2, help="seconds between chart samples (default 5)")
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR")] = "INFO",
) -> None:
    """Serve the admin dashboard at http://HOST:PORT/admin/ (token: TOKENQ_ADMIN_TOKEN;
    when unset, a one-off token is made and printed)."""
    from producer.bounded_server import serve_bounded
    from producer.dashboard.app import create_dashboard_app

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config, link = _config(read_only_view, sample_interval_s), f"http://{host}:{port}{PREFIX}/"
    if config.token_sha256 is None:
        token = secrets.token_urlsafe(24)
        config = config.with_token(token)
        link += f"#token={token}"
        typer.echo("TOKENQ_ADMIN_TOKEN is not set: made a one-off admin token for this run.")
    typer.echo(f"tokenq dashboard: {link}")
    app = create_dashboard_app(settings_for(redis_url), config)
    # Open live views (SSE) must not hold a SIGTERM for minutes: close them after a grace.
    serve_bounded(
        app,
        graceful_s=GRACEFUL_SHUTDOWN_S,
        host=host,
        port=port,
        log_level=log_level.lower(),
        access_log=False,
    )


def _config(read_only_view: bool, sample_interval_s: float | None) -> DashboardConfig:
    config = load_config()
    if read_only_view:
        config = replace(config, read_only_view=True)
    if sample_interval_s is not None:
        config = replace(config, sample_interval_s=sample_interval_s)
    return config


def main() -> None:
    typer.run(dashboard)
