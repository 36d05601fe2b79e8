"""``tokenq lora``: register, list and unregister LoRA adapters per base model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import redis
import typer
from rich.console import Console

from producer.cli_options import RedisOpt, cli_errors, settings_for
from shared.connection import close, connect
from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.loras import list_loras, new_adapter, register_lora, remove_lora
from shared.settings import DEFAULT_MODEL

lora_app = typer.Typer(help="LoRA adapters: requests name one with `lora` (or model base:name).")
console = Console(stderr=True)
ModelArg = Annotated[str, typer.Argument(help="the base model's served name")]


@lora_app.command("add")
def add(
    model: ModelArg,
    name: Annotated[str, typer.Argument(help="the adapter's name in requests")],
    path: Annotated[str, typer.Argument(help="a PEFT directory or a .safetensors file")],
    rank: Annotated[
        int | None,
        typer.Option(help="the adapter's rank, when PATH is only on the workers' hosts"),
    ] = None,
    redis_url: RedisOpt = None,
) -> None:
    """Register (or replace) adapter NAME of MODEL; every worker of MODEL must be able
    to read PATH (a relative path is made absolute here). Its rank is read from PATH;
    only workers whose --max-lora-rank covers it claim its requests."""
    with cli_errors(console, redis_url):
        local = Path(path).expanduser().absolute()
        _check_local(local)
        adapter = new_adapter(model, name, str(local), rank)
        with _registry(redis_url) as (connection, keys):
            added = register_lora(connection, keys, adapter)
        verb = "registered" if added else "replaced"
        print(f"{verb} {model}:{name} -> {local} (rank {adapter.rank})")


@lora_app.command("list")
def list_(
    model: Annotated[str, typer.Option(help="base model")] = DEFAULT_MODEL,
    redis_url: RedisOpt = None,
) -> None:
    """The adapters registered for MODEL."""
    with cli_errors(console, redis_url), _registry(redis_url) as (connection, keys):
        adapters = list_loras(connection, keys, model)
        for a in adapters:
            print(f"{a.model}:{a.name}  {a.path}  rank {a.rank or '?'}")
        console.print(f"[dim]{len(adapters)} adapter(s) for {model}[/]")


@lora_app.command("remove")
def remove(model: ModelArg, name: str, redis_url: RedisOpt = None) -> None:
    """Unregister adapter NAME of MODEL (requests naming it are refused from now on)."""
    with cli_errors(console, redis_url), _registry(redis_url) as (connection, keys):
        if not remove_lora(connection, keys, model, name):
            raise InvalidRequest(f"no LoRA adapter {name!r} is registered for model {model!r}")
        print(f"removed {model}:{name}")


@contextmanager
def _registry(redis_url: str | None) -> Iterator[tuple[redis.Redis, Keys]]:
    settings = settings_for(redis_url)
    connection = connect(settings.redis_url, settings.redis_cluster)
    try:
        yield connection, Keys(settings.namespace)
    finally:
        close(connection)


def _check_local(path: Path) -> None:
    """Catch a wrong path early when this host can see it; workers check it again."""
    if not path.exists():
        console.print(f"[yellow]note:[/] {path} is not on this host; workers must find it there")
        return
    if path.is_dir() and not (path / "adapter_config.json").exists():
        raise InvalidRequest(f"{path} is a directory without adapter_config.json (not PEFT)")
    if path.is_file() and path.suffix != ".safetensors":
        raise InvalidRequest(f"{path} is not a .safetensors file or a PEFT directory")
