"""llama.cpp's ``llama-server`` as a peer of the CPU benches: started on a free
loopback port with one thread on a GGUF file, and asked for greedy completions of
the same token ids the engine gets (bench/README.md says how to build it from the
llama.cpp sources on PyPI).

A server dies with this process even when it is killed outright (the kernel's
parent-death signal), and is stopped on the way out of :func:`serve` otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import gguf
import httpx

READY_TIMEOUT_S = 120
REQUEST_TIMEOUT_S = 600
STOP_TIMEOUT_S = 10
PR_SET_PDEATHSIG = 1  # linux/prctl.h
LOG_TAIL_LINES = 5


class LlamaServerError(RuntimeError):
    """llama-server would not start, or answered other than asked."""


def file_type(path: Path) -> str:
    """The GGUF file's weight type as llama.cpp names it (``Q4_1``, ``Q8_0``, ``F32``)."""
    field = gguf.GGUFReader(path).fields.get("general.file_type")
    if field is None:
        return path.stem
    name = gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def quantize(quantizer: Path, source: Path, weight_type: str, directory: Path) -> Path:
    """``source`` re-encoded as ``weight_type`` by llama.cpp's own ``llama-quantize``
    (from a quantized file too: its weights are widened first)."""
    target = directory / f"{source.stem}.{weight_type}.gguf"
    cmd = [str(quantizer), "--allow-requantize", str(source), str(target), weight_type]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = " | ".join(done.stdout.strip().splitlines()[-LOG_TAIL_LINES:])
        raise LlamaServerError(f"llama-quantize to {weight_type} failed: {tail}")
    return target


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@contextlib.contextmanager
def serve(binary: Path, model: Path, num_slots: int, slot_tokens: int) -> Iterator[str]:
    """A running llama-server on ``model`` (its base URL): one thread for prompts and
    decodes alike, ``num_slots`` sequences at once sharing one KV cache of
    ``num_slots * slot_tokens`` tokens."""
    port = _free_port()
    cmd = [
        *(str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)),
        *("-t", "1", "-tb", "1", "-np", str(num_slots), "--kv-unified"),
        *("-c", str(num_slots * slot_tokens), "--no-webui"),
    ]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(process, url, log)
            yield url
        finally:
            _stop(process)


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: IO[str]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            tail = " | ".join(log.read().strip().splitlines()[-LOG_TAIL_LINES:])
            raise LlamaServerError(f"llama-server exited with {process.returncode}: {tail}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=5).status_code == httpx.codes.OK:
                return
        time.sleep(0.2)
    raise LlamaServerError(f"llama-server not ready after {READY_TIMEOUT_S} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _body(prompt: list[int], num_tokens: int, stream: bool) -> dict[str, Any]:
    # The prompt is token ids, as the engine gets them; greedy, every token asked for.
    return {
        "prompt": prompt,
        "n_predict": num_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": stream,
    }


def _check_count(reply: dict[str, Any], num_tokens: int) -> int:
    got = int(reply.get("tokens_predicted", -1))
    if got != num_tokens:
        raise LlamaServerError(f"llama-server generated {got} tokens, {num_tokens} asked")
    return got


def one_stream(url: str, prompt: list[int], num_tokens: int) -> tuple[float, float]:
    """Tokens/s over the whole request and over its decode steps (after the first
    token arrived), timed here as the engine's are."""
    started = time.perf_counter()
    first = None
    final: dict[str, Any] = {}
    body = _body(prompt, num_tokens, stream=True)
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=REQUEST_TIMEOUT_S) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            first = first or time.perf_counter()
            final = event
    ended = time.perf_counter()
    _check_count(final, num_tokens)
    assert first is not None
    return num_tokens / (ended - started), (num_tokens - 1) / max(ended - first, 1e-9)


def burst(url: str, prompt: list[int], num_tokens: int, num_requests: int) -> float:
    """Tokens/s with ``num_requests`` requests sent at once, over the time until the
    last one is answered."""
    body = _body(prompt, num_tokens, stream=False)

    def complete(client: httpx.Client) -> int:
        reply = client.post(f"{url}/completion", json=body, timeout=REQUEST_TIMEOUT_S)
        reply.raise_for_status()
        return _check_count(reply.json(), num_tokens)

    limits = httpx.Limits(max_connections=num_requests)
    with httpx.Client(limits=limits) as client, ThreadPoolExecutor(num_requests) as pool:
        started = time.perf_counter()
        total = sum(pool.map(complete, [client] * num_requests))
        return total / (time.perf_counter() - started)
