"""`tokenq worker`: its options generated from the dataclasses that declare them
(``WorkerOptions``, ``EngineConfig``); the ``tokenq`` command mounts it by name."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from shared.cli_options import RedisOpt, configure_logging, settings_for
from worker.engine.config import EngineConfig
from worker.flags import Flags, command_with_options
from worker.options import WorkerOptions
from worker.vllm_engine.options import VllmOptions

console = Console(stderr=True)
# The dataclasses whose option fields `tokenq worker` offers, in the order --help shows them.
OPTION_SOURCES: tuple[type, ...] = (WorkerOptions, EngineConfig, VllmOptions)


@command_with_options(*OPTION_SOURCES)
def worker(
    flags: Flags,
    redis_url: RedisOpt = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR")] = "INFO",
) -> None:
    """Run a worker that claims requests for MODEL and streams results back."""
    from worker.engine.errors import ModelLoadError
    from worker.engine_process import EngineProcessDied
    from worker.main import engine_config, run_worker
    from worker.vllm_engine.config import VllmMissing

    configure_logging(log_level)
    settings = settings_for(redis_url)
    opts = flags.of(WorkerOptions)
    model = opts.model or settings.default_model
    try:
        config = engine_config(model, flags)
    except (ValueError, VllmMissing) as e:
        console.print(f"[red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from e
    try:
        run_worker(settings, opts, config)
    except (ModelLoadError, EngineProcessDied) as e:  # one line: what failed and why
        console.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from e
