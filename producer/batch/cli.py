"""``tokenq batch``: submit, follow, cancel and read batches; run the RQ worker;
list and resend webhook deliveries."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from producer.batch import webhooks
from producer.batch.context import check_batch_redis, job_context
from producer.batch.models import BatchStatus
from producer.batch.ops import Batches
from producer.cli_options import RedisOpt, cli_errors, settings_for
from producer.client import Client
from shared.connection import connect
from shared.settings import get_settings

batch_app = typer.Typer(
    help="Batches of requests (OpenAI batch JSONL) and their webhooks.", no_args_is_help=True
)
webhooks_app = typer.Typer(help="Webhook deliveries: list them, send one again.")
batch_app.add_typer(webhooks_app, name="webhooks")
console = Console(stderr=True)
POLL_S = 0.5


@batch_app.command("submit")
def submit(
    file: Annotated[Path, typer.Argument(help="JSONL: one request per line, with custom_id")],
    redis_url: RedisOpt = None,
    priority: Annotated[str, typer.Option(help="low, normal, high, critical or 0..100")] = "low",
    model: Annotated[str | None, typer.Option(help="model for lines that name none")] = None,
    webhook: Annotated[str | None, typer.Option(help="URL to POST to when it ends")] = None,
    wait: Annotated[bool, typer.Option(help="show progress until it ends")] = False,
) -> None:
    """Create a batch from FILE and print its id."""
    with cli_errors(console, redis_url), _batches(redis_url) as batches:
        batch_id = batches.submit(file, priority=priority, model=model, webhook_url=webhook)
        print(batch_id)
        if wait:
            _follow(batches, batch_id)


@batch_app.command("status")
def status(
    batch_id: str,
    redis_url: RedisOpt = None,
    wait: Annotated[bool, typer.Option(help="show a progress bar until it ends")] = False,
) -> None:
    """Print a batch's status as JSON (or follow it with a progress bar)."""
    with cli_errors(console, redis_url), _batches(redis_url) as batches:
        if wait:
            _follow(batches, batch_id)
        print(batches.status(batch_id).model_dump_json(indent=2))


@batch_app.command("list")
def list_batches(redis_url: RedisOpt = None, limit: int = 20) -> None:
    """The newest batches with their progress."""
    with cli_errors(console, redis_url), _batches(redis_url) as batches:
        for s in batches.list(limit):
            c = s.counts
            print(f"{s.id}  {s.state:<11}  {c.done}/{c.total} done  {c.failed} failed")


@batch_app.command("cancel")
def cancel(batch_id: str, redis_url: RedisOpt = None) -> None:
    """Cancel a batch: queued lines stop at once; finished lines keep their results."""
    with cli_errors(console, redis_url), _batches(redis_url) as batches:
        s = batches.cancel(batch_id)
        print(f"{batch_id} {s.state}: {s.counts.completed} completed, {s.counts.failed} failed")


@batch_app.command("resume")
def resume(batch_id: str, redis_url: RedisOpt = None) -> None:
    """Start a new driver job for a batch whose RQ jobs were lost."""
    with cli_errors(console, redis_url), _batches(redis_url) as batches:
        print(f"{batch_id} driven by job {batches.resume(batch_id)}")


@batch_app.command("results")
def results(
    batch_id: str,
    redis_url: RedisOpt = None,
    output: Annotated[Path | None, typer.Option(help="write outputs here, not stdout")] = None,
    errors: Annotated[Path | None, typer.Option(help="write error lines here")] = None,
) -> None:
    """Print the output JSONL (by custom_id, in input order); errors go to --errors."""
    with cli_errors(console, redis_url), _batches(redis_url) as batches:
        outputs, failed = batches.results(batch_id)
        _write(outputs, output)
        if errors is not None:
            _write(failed, errors)
        console.print(f"[dim]{len(outputs)} output line(s), {len(failed)} error line(s)[/]")


@batch_app.command("worker")
def worker(
    redis_url: RedisOpt = None,
    burst: Annotated[bool, typer.Option(help="exit once the queues are empty")] = False,
    scheduler: Annotated[bool, typer.Option(help="run RQ's scheduler (webhook backoff)")] = True,
    log_level: Annotated[str, typer.Option(help="RQ's log level (INFO logs every job)")] = "INFO",
) -> None:
    """Run an RQ worker for batch jobs and webhook deliveries."""
    from producer.batch.worker import run_worker

    with cli_errors(console, redis_url):
        settings = settings_for(redis_url)
        check_batch_redis(settings)
        connection = connect(settings.batch_redis_url or settings.redis_url)
    os.environ["TOKENQ_REDIS_URL"] = settings.redis_url  # for the jobs' settings
    get_settings.cache_clear()
    ctx = job_context(connection, settings)
    run_worker(ctx, burst=burst, with_scheduler=scheduler, logging_level=log_level.upper())


@webhooks_app.command("list")
def webhooks_list(
    redis_url: RedisOpt = None,
    failed: Annotated[bool, typer.Option(help="only those whose retries ran out")] = False,
    limit: int = 50,
) -> None:
    """Webhook deliveries, newest first, with their last error."""
    with cli_errors(console, redis_url), _batches(redis_url) as batches:
        for d in webhooks.list_deliveries(batches.ctx, failed_only=failed, limit=limit):
            print(f"{d.id}  {d.state:<9}  {d.attempts} attempt(s)  {d.url}  {d.last_error or ''}")


@webhooks_app.command("retry")
def webhooks_retry(delivery_id: str, redis_url: RedisOpt = None) -> None:
    """Send a delivery again, with a fresh set of retries."""
    with cli_errors(console, redis_url), _batches(redis_url) as batches:
        webhooks.redeliver(batches.ctx, delivery_id)
        print(f"{delivery_id} queued for delivery")


@contextmanager
def _batches(redis_url: str | None) -> Iterator[Batches]:
    with Client(settings=settings_for(redis_url)) as client:
        yield Batches(client)


def _follow(batches: Batches, batch_id: str) -> BatchStatus:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        s = batches.status(batch_id)
        task = progress.add_task(batch_id, total=s.counts.total, failed=0)
        while True:
            progress.update(task, completed=s.counts.done, failed=s.counts.failed)
            if s.state.terminal:
                return s
            time.sleep(POLL_S)
            s = batches.status(batch_id)


def _write(lines: list[bytes], path: Path | None) -> None:
    data = b"".join(line + b"\n" for line in lines)
    if path is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        path.write_bytes(data)


if __name__ == "__main__":
    batch_app()
