"""The ``tokenq`` command line.

Worker commands import ``worker`` (and so torch) only when they run, so the
producer side installs and starts without the model stack.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Annotated

import redis
import typer
from rich.console import Console

from producer.client import Client, Handle
from producer.embedded import EmbeddedRedis, up_state_file, wait_for_redis
from shared.errors import TokenqError
from shared.models import FinalEvent, TokenEvent
from shared.settings import DEFAULT_MODEL, Settings

app = typer.Typer(help="tokenq: prioritized LLM generation through Redis.", no_args_is_help=True)
console = Console(stderr=True)

RedisOpt = Annotated[
    str | None,
    typer.Option("--redis", help="Redis URL (default: TOKENQ_REDIS_URL, else a running `tokenq up`)"),
]
ModelOpt = Annotated[str, typer.Option(help="model name or local path")]


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


@app.command()
def worker(
    redis_url: RedisOpt = None,
    model: ModelOpt = DEFAULT_MODEL,
    served_model_name: Annotated[str | None, typer.Option(help="name clients use")] = None,
    device: str = "auto",
    dtype: str = "auto",
    max_num_seqs: Annotated[int | None, typer.Option(help="most requests in a batch")] = None,
    kv_cache_mib: Annotated[int | None, typer.Option(help="KV cache budget in MiB")] = None,
    burst: Annotated[bool, typer.Option(help="exit once the queue is empty")] = False,
    log_level: str = "INFO",
) -> None:
    """Run a worker that claims requests for MODEL and streams results back."""
    from worker.main import WorkerOptions, run_worker

    _logging(log_level)
    opts = WorkerOptions(model=model, served_model_name=served_model_name, device=device,
                         dtype=dtype, max_num_seqs=max_num_seqs, kv_cache_mib=kv_cache_mib,
                         burst=burst)  # fmt: skip
    run_worker(settings_for(redis_url), opts)


@app.command()
def up(model: ModelOpt = DEFAULT_MODEL, log_level: str = "INFO") -> None:
    """Everything on this host: an embedded Redis and a worker on MODEL."""
    _logging(log_level)
    server = EmbeddedRedis().start()
    state = up_state_file()
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(server.url)
    cmd = [sys.executable, "-m", "producer.cli", "worker", "--redis", server.url, "--model", model]
    proc = subprocess.Popen(cmd)
    console.print(f"[bold]tokenq is up[/]: Redis {server.url} ({server.kind}), worker on {model}")
    console.print('From another shell:  [bold]tokenq submit "Tell me a joke" --stream[/]')
    try:
        proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=60)
    finally:
        state.unlink(missing_ok=True)
        server.stop()


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
) -> None:
    """Submit PROMPT and print the answer."""
    settings = settings_for(redis_url)
    try:
        wait_for_redis(settings.redis_url, timeout_s=2)
        with Client(settings=settings) as client:
            text = {"prompt": prompt} if raw else {"messages": [{"role": "user", "content": prompt}]}
            handle = client.submit(**text, model=model, priority=priority, max_tokens=max_tokens,
                                   temperature=temperature)  # fmt: skip
            console.print(f"[dim]request {handle.id} queued at position {handle.position()}[/]")
            _print_stream(handle) if stream else _print_result(handle)
    except (TokenqError, redis.ConnectionError) as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(1) from e


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
    console.print(f"[dim]finish: {result.finish_reason}, {result.usage.completion_tokens} tokens[/]")


def _print_final(final: FinalEvent) -> None:
    t = final.timings
    console.print(
        f"[dim]finish: {final.finish_reason}, {final.usage.completion_tokens} tokens, "
        f"ttft {t.ttft_s}s, total {t.total_s}s[/]"
    )


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
