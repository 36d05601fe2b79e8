"""When `tokenq up` may say it is up: its worker serves (it passed its self-check and
registered as ``serving``) and its gateway answers; and what it then tells the user."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import redis
from rich.console import Console
from rich.markup import escape

from shared.connection import connect
from shared.keys import Keys
from shared.registry import SERVING_STATE, live_workers_of
from shared.replies import text
from shared.settings import Settings

POLL_S = 0.5


@dataclass(frozen=True)
class Gateway:
    """The gateway `tokenq up` started: where it listens and its admin token."""

    port: int
    admin_token: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def wait_until_serving(
    redis_url: str, model: str, procs: list[subprocess.Popen[bytes]], gateway: Gateway | None
) -> bool:
    """Wait until a worker of ``model`` serves and ``gateway`` (if any) is ready; False
    as soon as one of ``procs`` has exited instead (`tokenq up` then stops the rest)."""
    settings = Settings(redis_url=redis_url)
    connection = connect(settings.redis_url, settings.redis_cluster)
    keys = Keys(settings.namespace)
    try:
        while all(p.poll() is None for p in procs):
            if _worker_serves(connection, keys, model) and _gateway_ready(gateway):
                return True
            time.sleep(POLL_S)
        return False
    finally:
        connection.close()


def _worker_serves(connection: redis.Redis, keys: Keys, model: str) -> bool:
    for worker_id in live_workers_of(connection, keys, model):
        state = connection.hget(keys.worker(worker_id), "state")
        if state is not None and text(state) == SERVING_STATE:
            return True
    return False


def _gateway_ready(gateway: Gateway | None) -> bool:
    if gateway is None:
        return True
    try:
        with urllib.request.urlopen(f"{gateway.url}/readyz", timeout=2) as reply:
            return int(reply.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def say_up(console: Console, model: str, gateway: Gateway | None, redis_line: str) -> None:
    """Where everything is, whether the gateway wants keys, and what to try next (each
    on one line, however narrow the terminal: they are copied from)."""
    lines = [f"[bold]tokenq is up[/]: {redis_line}, worker serving {model}"]
    if gateway is not None:
        lines += [
            f"HTTP (OpenAI-compatible): {gateway.url}/v1",
            f"Dashboard: {gateway.url}/admin/#token={gateway.admin_token}",
            f"API keys: {api_keys_line()}",
        ]
    lines += [
        "Try it from another shell:",
        f'  [bold]{tokenq_command()} submit "Tell me a joke" --stream[/]',
    ]
    if gateway is not None:
        lines.append(f"  [bold]{escape(curl_command(gateway, model))}[/]")
    for line in lines:
        console.print(line, soft_wrap=True)


def api_keys_on() -> bool:
    """Whether the gateway (which reads the same environment) asks for API keys."""
    return bool(Settings().api_keys.get_secret_value().strip())


def api_keys_line() -> str:
    if api_keys_on():
        return "on (TOKENQ_API_KEYS): send 'Authorization: Bearer <key>'"
    return "off: anyone who reaches the port may call it (set TOKENQ_API_KEYS to require keys)"


def curl_command(gateway: Gateway, model: str) -> str:
    body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hi!"}}]}}'
    auth = "-H 'Authorization: Bearer <key>' " if api_keys_on() else ""
    return (
        f"curl {gateway.url}/v1/chat/completions {auth}"
        f"-H 'Content-Type: application/json' -d '{body}'"
    )


def tokenq_command() -> str:
    """``tokenq`` when that is the one on PATH, else the path of this environment's."""
    script = Path(sys.executable).with_name("tokenq")
    if not script.exists() or shutil.which("tokenq") == str(script):
        return "tokenq"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)
