"""`tokenq up`: everything on one host, on an embedded default."""

from __future__ import annotations

import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from rich.console import Console

from producer.client import Client
from producer.embedded import EmbeddedRedis, die_with_parent, free_port
from producer.up_ready import Gateway, say_up, wait_until_serving
from shared.cli_options import up_state_file
from shared.registry import mark_served
from shared.settings import Settings

GATEWAY_PORT = 8000
# How long the children get to stop (the worker's drain) before they are killed.
STOP_TIMEOUT_S = 60.0


class StopRequested(Exception):
    """SIGTERM (or SIGHUP) reached `tokenq up`: stop everything, as Ctrl-C does."""


def run_up(
    model: str, port: int | None, console: Console, worker_args: tuple[str, ...] = ()
) -> None:
    """An embedded Redis, a worker on MODEL and (when the gateway extra is installed) a
    gateway with the dashboard; until Ctrl-C, SIGTERM or one of them stops. Each way
    out stops every child (the worker drains) before it returns: a supervisor's SIGTERM
    to this process alone leaves nothing running, and a SIGKILL sends each child a
    SIGTERM of its own (``die_with_parent``). ``worker_args`` go to the worker's
    command line as they are (``--quantization int8``)."""
    _on_stop_signals(_raise_stop)
    procs: list[subprocess.Popen[bytes]] = []
    server: EmbeddedRedis | None = None
    state = up_state_file()
    try:
        server = EmbeddedRedis().start()
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_text(server.url)
        announce_model(server.url, model)
        procs.append(_tokenq("worker", "--redis", server.url, "--model", model, *worker_args))
        # Batches (/v1/batches, `tokenq batch`) are driven by RQ jobs: one RQ worker.
        procs.append(_tokenq("batch", "worker", "--redis", server.url, "--log-level", "WARNING"))
        gateway_procs, gateway = _gateway(server.url, port, console)
        procs += gateway_procs
        console.print(f"waiting for the worker: {model} loads, then its self-check runs...")
        if wait_until_serving(server.url, model, procs, gateway):
            say_up(console, model, gateway, f"Redis {server.url} ({server.kind})")
        _wait_any(procs)
    except (KeyboardInterrupt, StopRequested):
        pass
    finally:
        _shut_down(procs, server, state, console)


def _shut_down(
    procs: list[subprocess.Popen[bytes]],
    server: EmbeddedRedis | None,
    state: Path,
    console: Console,
) -> None:
    """Stop the children, then Redis (the worker's drain still writes to it). Another
    stop signal meanwhile hurries it: the children are killed instead of waited for."""
    hurry = threading.Event()
    _on_stop_signals(lambda *_: hurry.set())
    console.print("[dim]stopping: the worker drains, then the gateway and Redis stop[/]")
    _stop(procs, hurry)
    state.unlink(missing_ok=True)
    if server is not None:
        server.stop()


def _on_stop_signals(handler: Any) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, handler)


def _raise_stop(signum: int, _frame: Any) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise StopRequested(signal.Signals(signum).name)


def announce_model(redis_url: str, model: str) -> None:
    """Mark MODEL as served right away, so submits are accepted while it loads."""
    with Client(settings=Settings(redis_url=redis_url)) as client:
        pipe = client.redis.pipeline(transaction=False)
        mark_served(pipe, client.keys, client.settings, model)
        pipe.execute()


def _gateway(
    redis_url: str, port: int | None, console: Console
) -> tuple[list[subprocess.Popen[bytes]], Gateway | None]:
    if importlib.util.find_spec("fastapi") is None:
        console.print("[dim]no gateway: install tokenq[gateway] for HTTP and the dashboard[/]")
        return [], None
    port = port or (GATEWAY_PORT if _port_free(GATEWAY_PORT) else free_port())
    token = os.environ.get("TOKENQ_ADMIN_TOKEN") or secrets.token_urlsafe(18)
    proc = _tokenq(
        "gateway",
        "--redis",
        redis_url,
        "--port",
        str(port),
        "--log-level",
        "warning",
        env={"TOKENQ_ADMIN_TOKEN": token},
    )
    return [proc], Gateway(port, token)


def _tokenq(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "producer.cli", *args],
        env={**os.environ, **(env or {})},
        preexec_fn=die_with_parent,
    )


def _port_free(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _wait_any(procs: list[subprocess.Popen[bytes]]) -> None:
    while all(p.poll() is None for p in procs):
        time.sleep(0.5)


def _stop(procs: list[subprocess.Popen[bytes]], hurry: threading.Event) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if hurry.wait(0.1):
            break
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
