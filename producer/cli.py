"""The ``tokenq`` command line.

Worker commands import ``worker`` (and so torch) only when they run, so the
producer side installs and starts without the model stack.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
from rich.console import Console

from producer.admin import Admin
from producer.batch.cli import batch_app
from producer.cli_options import RedisOpt, cli_errors, settings_for
from producer.client import Client, Handle
from producer.dashboard.cli import dashboard
from producer.gateway.cli import gateway
from producer.lora_cli import lora_app
from producer.usage_cli import usage
from shared.models import FinalEvent, RequestState, RequestStatus, TokenEvent
from shared.settings import DEFAULT_MODEL

app = typer.Typer(help="tokenq: prioritized LLM generation through Redis.", no_args_is_help=True)
console = Console(stderr=True)

ModelOpt = Annotated[str, typer.Option(help="model name or local path")]
QuantizationOpt = Annotated[
    str | None,
    typer.Option(
        help="int8: keep the projections' weights in 8 bits (CPU; the built-in engine); "
        "default: the checkpoint's dtype"
    ),
]


@app.command()
def worker(
    redis_url: RedisOpt = None,
    model: Annotated[
        str | None, typer.Option(help="name, local path, or sim:... (default TOKENQ_DEFAULT_MODEL)")
    ] = None,
    served_model_name: Annotated[str | None, typer.Option(help="name clients use")] = None,
    device: str = "auto",
    dtype: str = "auto",
    max_num_seqs: Annotated[int | None, typer.Option(help="most requests in a batch")] = None,
    kv_cache_mib: Annotated[
        int | None, typer.Option(help="KV cache budget in MiB (a hybrid's state slots too)")
    ] = None,
    pooling: Annotated[
        str, typer.Option(help="how embeddings pool the last hidden state: mean, last or cls")
    ] = "mean",
    max_loras: Annotated[
        int, typer.Option(help="LoRA adapters resident at once (0: claims no adapter requests)")
    ] = 4,
    max_lora_rank: Annotated[
        int, typer.Option(help="the largest adapter rank it loads (and claims requests of)")
    ] = 16,
    burst: Annotated[bool, typer.Option(help="exit once the queue is empty")] = False,
    enforce_eager: Annotated[
        bool, typer.Option(help="on CUDA, run every step eagerly (no CUDA graphs)")
    ] = False,
    max_model_len: Annotated[
        int | None,
        typer.Option(help="most tokens one request may hold (default: the model's context)"),
    ] = None,
    self_check: Annotated[
        bool,
        typer.Option(
            help="at start-up, compare the engine's logits with transformers' and refuse "
            "to serve a model that differs"
        ),
    ] = True,
    trust_remote_code: Annotated[
        bool, typer.Option(help="let the model run code from its own repository")
    ] = False,
    async_scheduling: Annotated[
        bool | None,
        typer.Option(
            help="schedule the next step while one runs (off: wait for each step); default: on "
            "on CUDA and the timed forward, off on the CPU's own forward"
        ),
    ] = None,
    timed_forward_ms: Annotated[
        float | None,
        typer.Option(
            help="benchmarks: the model's forward replaced by a wait of this long "
            "(deterministic tokens, not the model's)"
        ),
    ] = None,
    grammar_compile_threads: Annotated[
        int, typer.Option(help="threads compiling structured-output grammars")
    ] = 4,
    grammar_compile_timeout_s: Annotated[
        float, typer.Option(help="a grammar still compiling after this ends its requests")
    ] = 10.0,
    engine_process: Annotated[
        bool,
        typer.Option(
            help="run the engine in a child process of its own, beside the worker's Redis "
            "side and tokenizer (default: off, one process)"
        ),
    ] = False,
    quantization: QuantizationOpt = None,
    speculative_config: Annotated[
        str | None,
        typer.Option(
            help="speculative decoding in the built-in engine, as vLLM's JSON: "
            '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
            '"prompt_lookup_min": 2}\' (n-gram prompt lookup; or \'{"model": PATH}\' for a draft '
            "model sharing the tokenizer), verified in one forward; greedy output unchanged; "
            "off above disable_by_batch_size sequences, default 4; "
            "default: off"
        ),
    ] = None,
    log_level: str = "INFO",
) -> None:
    """Run a worker that claims requests for MODEL and streams results back."""
    from worker.engine.errors import ModelLoadError
    from worker.engine_process import EngineProcessDied
    from worker.main import WorkerOptions, engine_config, run_worker

    _logging(log_level)
    settings = settings_for(redis_url)
    opts = WorkerOptions(
        model=model or settings.default_model,
        served_model_name=served_model_name,
        device=device,
        dtype=dtype,
        max_num_seqs=max_num_seqs,
        kv_cache_mib=kv_cache_mib,
        pooling=pooling,
        max_loras=max_loras,
        max_lora_rank=max_lora_rank,
        burst=burst,
        enforce_eager=enforce_eager,
        max_model_len=max_model_len,
        self_check=self_check,
        trust_remote_code=trust_remote_code,
        async_scheduling=async_scheduling,
        timed_forward_ms=timed_forward_ms,
        grammar_compile_threads=grammar_compile_threads,
        grammar_compile_timeout_s=grammar_compile_timeout_s,
        engine_process=engine_process,
        quantization=quantization,
        speculative_config=speculative_config,
    )
    try:
        config = engine_config(opts)
    except ValueError as e:
        console.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from e
    try:
        run_worker(settings, opts, config)
    except (ModelLoadError, EngineProcessDied) as e:  # one line: what failed and why
        console.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from e


@app.command()
def up(
    model: ModelOpt = DEFAULT_MODEL,
    port: Annotated[int | None, typer.Option(help="gateway port (default 8000, else free)")] = None,
    quantization: QuantizationOpt = None,
    log_level: str = "INFO",
) -> None:
    """Everything on this host: an embedded Redis, a worker on MODEL, a gateway."""
    from producer.up import run_up

    _logging(log_level)
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


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
