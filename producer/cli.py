"""The ``tokenq`` command line.

`tokenq worker` lives in the worker package (``worker/cli.py``, its options generated
from the dataclasses that declare them); it is mounted here by module name and imported
only when it is asked for, so the producer side imports nothing of the worker's.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from producer.admin import Admin
from producer.batch.cli import batch_app
from producer.cli_options import RedisOpt, cli_errors, settings_for
from producer.client import Client, Handle
from producer.dashboard.cli import dashboard
from producer.gateway.cli import gateway
from producer.lora_cli import lora_app
from producer.usage_cli import usage
from shared.cli_options import configure_logging
from shared.models import FinalEvent, RequestState, RequestStatus, TokenEvent
from shared.settings import DEFAULT_MODEL

# Commands of other packages, by name: the module that defines each and its function.
MOUNTED = {"worker": ("worker.cli", "worker")}


class Commands(TyperGroup):
    """tokenq's commands, with those of ``MOUNTED`` imported only when looked up."""

    # ``Any``: typer's Context and Command are those of the click typer carries inside it.
    def list_commands(self, ctx: Any) -> list[str]:
        return [*MOUNTED, *super().list_commands(ctx)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in MOUNTED:
            return super().get_command(ctx, cmd_name)
        module, function = MOUNTED[cmd_name]
        mounted = typer.Typer(add_completion=False)
        mounted.command(cmd_name)(getattr(importlib.import_module(module), function))
        return typer.main.get_command(mounted)


app = typer.Typer(
    cls=Commands, help="tokenq: prioritized LLM generation through Redis.", no_args_is_help=True
)
console = Console(stderr=True)

ModelOpt = Annotated[str, typer.Option(help="model name or local path")]
QuantizationOpt = Annotated[
    str | None,
    typer.Option(
        help="int8: keep the projections' weights in 8 bits (CPU; the built-in engine); "
        "w8a8: the same weights, and each row's activations in 8 bits too (faster, "
        "agrees less with fp32; CPUs with VNNI); default: the checkpoint's dtype"
    ),
]


@app.command()
def up(
    model: ModelOpt = DEFAULT_MODEL,
    port: Annotated[int | None, typer.Option(help="gateway port (default 8000, else free)")] = None,
    quantization: QuantizationOpt = None,
    log_level: str = "INFO",
) -> None:
    """Everything on this host: an embedded Redis, a worker on MODEL, a gateway."""
    from producer.up import run_up

    configure_logging(log_level)
    run_up(model, port, console, () if quantization is None else ("--quantization", quantization))


@app.command()
def submit(
    prompt: str,
    redis_url: RedisOpt = None,
    model: ModelOpt = DEFAULT_MODEL,
    priority: Annotated[str, typer.Option(help="low, normal, high, critical or 0..100")] = "normal",
    max_tokens: int = 256,
    temperature: float = 0.0,
    raw: Annotated[bool, typer.Option(help="send as a plain prompt, not a chat message")] = False,
    stream: Annotated[bool, typer.Option(help="print tokens as they arrive")] = False,
    lora: Annotated[str | None, typer.Option(help="a LoRA adapter registered for MODEL")] = None,
) -> None:
    """Submit PROMPT and print the answer."""
    with cli_errors(console, redis_url), _client(redis_url) as client:
        text = {"prompt": prompt} if raw else {"messages": [{"role": "user", "content": prompt}]}
        handle = client.submit(
            **text,
            model=model,
            priority=priority,
            max_tokens=max_tokens,
            temperature=temperature,
            lora=lora,
        )
        console.print(f"[dim]request {handle.id} {state_line(handle.status())}[/]")
        _print_stream(handle) if stream else _print_result(handle)


dead_app = typer.Typer(help="The dead-letter set: requests that could not be run.")
app.add_typer(dead_app, name="dead")
app.add_typer(batch_app, name="batch")
app.add_typer(lora_app, name="lora")
app.command()(dashboard)
app.command()(gateway)
app.command()(usage)


def _client(redis_url: str | None) -> Client:
    return Client(settings=settings_for(redis_url))


@app.command()
def cancel(request_id: str, redis_url: RedisOpt = None) -> None:
    """Cancel a request: removed at once if queued, stopped within a step if running."""
    with cli_errors(console, redis_url), _client(redis_url) as client:
        print(client.handle(request_id).cancel())


@app.command()
def status(request_id: str, redis_url: RedisOpt = None) -> None:
    """Print a request's status as JSON."""
    with cli_errors(console, redis_url), _client(redis_url) as client:
        print(client.handle(request_id).status().model_dump_json(indent=2))


@dead_app.command("list")
def dead_list(redis_url: RedisOpt = None, limit: int = 100) -> None:
    """List dead-lettered requests with their reasons."""
    with cli_errors(console, redis_url), _client(redis_url) as client:
        entries = Admin(client).dead(limit)
        for e in entries:
            print(f"{e.request_id}  {e.model}  {e.reason}")
        console.print(f"[dim]{len(entries)} dead-lettered[/]")


@dead_app.command("retry")
def dead_retry(request_id: str, redis_url: RedisOpt = None) -> None:
    """Queue a dead-lettered request again, from the start."""
    with cli_errors(console, redis_url), _client(redis_url) as client:
        if not Admin(client).retry(request_id):
            console.print(f"[red]error:[/] {request_id} is not in the dead-letter set")
            raise typer.Exit(1)
        print(f"{request_id} queued again")


@dead_app.command("purge")
def dead_purge(redis_url: RedisOpt = None) -> None:
    """Delete every dead-lettered request."""
    with cli_errors(console, redis_url), _client(redis_url) as client:
        print(f"purged {Admin(client).purge()} request(s)")


def state_line(status: RequestStatus) -> str:
    """Where a request stands, as `tokenq submit` says it: its place in the queue, the
    worker running it, or how it ended."""
    if status.state is RequestState.QUEUED:
        ahead = status.position
        return "queued" if ahead is None else f"queued at position {ahead}"
    if status.state is RequestState.RUNNING:
        return "running" if status.worker is None else f"running on {status.worker}"
    return str(status.state)


def _print_stream(handle: Handle) -> None:
    for item in handle.stream():
        if isinstance(item.event, TokenEvent):
            sys.stdout.write(item.event.text)
            sys.stdout.flush()
        elif isinstance(item.event, FinalEvent):
            sys.stdout.write("\n")
            _print_final(item.event)


def _print_result(handle: Handle) -> None:
    result = handle.result()
    print(result.text)
    console.print(
        f"[dim]finish: {result.finish_reason}, {result.usage.completion_tokens} tokens[/]"
    )


def _print_final(final: FinalEvent) -> None:
    t = final.timings
    console.print(
        f"[dim]finish: {final.finish_reason}, {final.usage.completion_tokens} tokens, "
        f"ttft {t.ttft_s}s, total {t.total_s}s[/]"
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
