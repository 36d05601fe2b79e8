"""``bench/through_redis.py --engine vllm``: vLLM's engine alone (``LLM.generate``, in
``.venv-vllm``) against a ``tokenq worker --engine vllm`` through Redis, and the built-in
engine the same two ways, alternated in one run on the same workload and dtype."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from shared.settings import DEFAULT_MODEL, Settings
from worker.model_store import resolve_model

REPO = Path(__file__).resolve().parents[1]
VLLM_VENV = REPO / ".venv-vllm"
GENERATE = REPO / "bench" / "vllm_generate.py"
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def vllm_alone(rows: list[dict[str, Any]], engine_args: dict[str, Any]) -> float:
    """New tokens per second of ``LLM.generate`` on every request at once."""
    with tempfile.TemporaryDirectory() as tmp:
        cases, out = Path(tmp) / "cases.jsonl", Path(tmp) / "out.json"
        cases.write_text("".join(json.dumps(_case(r)) + "\n" for r in rows))
        pairs = [f"{k}={json.dumps(v)}" for k, v in engine_args.items()]
        model = str(resolve_model(DEFAULT_MODEL))
        cmd = [str(VLLM_VENV / "bin" / "python"), str(GENERATE), model, str(cases), str(out)]
        env = {**os.environ, **VLLM_ENV, "PYTHONPATH": str(REPO)}
        subprocess.run([*cmd, *pairs], env=env, check=True, capture_output=True)
        done = json.loads(out.read_text())
    num_tokens = sum(len(r["token_ids"]) for r in done["results"])
    return float(num_tokens / done["generate_s"])


def _case(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "messages": row["messages"],
        "max_tokens": row["max_tokens"],
        "temperature": 0.0,
        "ignore_eos": True,
    }


def vllm_worker_flags(engine_args: dict[str, Any]) -> list[str]:
    flags = ["--engine", "vllm"]
    for key, value in engine_args.items():
        flags += ["--vllm-arg", f"{key}={json.dumps(value)}"]
    return flags


def start_vllm_worker(url: str, engine_args: dict[str, Any]) -> subprocess.Popen[bytes]:
    tokenq = VLLM_VENV / "bin" / "tokenq"
    if not tokenq.exists():
        raise SystemExit(f"{VLLM_VENV} is missing: run  make vllm-setup")
    cmd = [str(tokenq), "worker", "--redis", url, "--model", DEFAULT_MODEL]
    cmd += [*vllm_worker_flags(engine_args), "--log-level", "WARNING"]
    return subprocess.Popen(cmd, env={**os.environ, **VLLM_ENV})


def main_vllm(rows: list[dict[str, Any]], engine_args: dict[str, Any], rounds: int) -> None:
    """Both engines alone and through Redis, alternated ``rounds`` times; the ratios."""
    from bench.through_redis import engine_alone, through_redis, wait_ready, worker_run
    from producer.embedded import EmbeddedRedis

    dtype = engine_args.get("dtype", "float32")
    builtin_extra = {"dtype": dtype}
    ratios: dict[str, list[float]] = {"vllm": [], "builtin": [], "alone": [], "redis": []}
    for round_no in range(rounds):
        v_alone = vllm_alone(rows, {"dtype": dtype, **engine_args})
        server = EmbeddedRedis().start()
        worker = start_vllm_worker(server.url, {"dtype": dtype, **engine_args})
        try:
            wait_ready(redis.Redis.from_url(server.url), Settings(redis_url=server.url), 1800)
            v_redis, _ = through_redis(server.url, rows, DEFAULT_MODEL)
        finally:
            worker.terminate()
            worker.wait(timeout=120)
            server.stop()
        b_alone = engine_alone(rows, "cpu", builtin_extra)
        b_redis = worker_run("cpu", rows, ("--dtype", dtype)).tokens_per_s
        print(
            f"round {round_no + 1}: vLLM alone {v_alone:7.1f} tok/s, through Redis "
            f"{v_redis:7.1f} tok/s = {v_redis / v_alone:.2f}x; built-in alone {b_alone:7.1f} "
            f"tok/s, through Redis {b_redis:7.1f} tok/s = {b_redis / b_alone:.2f}x; "
            f"built-in / vLLM: alone {b_alone / v_alone:.2f}x, through Redis "
            f"{b_redis / v_redis:.2f}x"
        )
        for name, value in (
            ("vllm", v_redis / v_alone),
            ("builtin", b_redis / b_alone),
            ("alone", b_alone / v_alone),
            ("redis", b_redis / v_redis),
        ):
            ratios[name].append(value)
    med = {name: statistics.median(values) for name, values in ratios.items()}
    print(
        f"median over {rounds} round(s): vLLM through Redis {med['vllm']:.2f}x vLLM alone "
        f"(goal >= 0.9); built-in through Redis {med['builtin']:.2f}x built-in alone; "
        f"built-in / vLLM {med['alone']:.2f}x alone, {med['redis']:.2f}x through Redis"
    )


STREAM = REPO / "bench" / "vllm_stream.py"
# One OpenMP thread on vLLM's CPU backend (its default binds one to every core), the
# one thread bench/latency.py gives the built-in engine.
ONE_THREAD_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0"}


@contextlib.contextmanager
def vllm_one_stream(engine_args: dict[str, Any]) -> Iterator[Callable[[list[int], int], Any]]:
    """vLLM's engine started once in ``.venv-vllm`` (``bench/vllm_stream.py``), one
    thread, fp32 unless told; yields what runs one request on it, ``(prompt ids,
    tokens) -> (tokens/s whole, tokens/s decoding)``."""
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{VLLM_VENV} is missing: run  make vllm-setup")
    pairs = [f"{k}={json.dumps(v)}" for k, v in {"dtype": "float32", **engine_args}.items()]
    cmd = [str(python), str(STREAM), str(resolve_model(DEFAULT_MODEL)), *pairs]
    env = {**os.environ, **VLLM_ENV, **ONE_THREAD_ENV, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None  # both piped above
    stdin, stdout = child.stdin, child.stdout

    def one_stream(prompt: list[int], num_tokens: int) -> tuple[float, float]:
        stdin.write(json.dumps({"prompt_token_ids": prompt, "max_tokens": num_tokens}) + "\n")
        stdin.flush()
        while not (line := stdout.readline()).startswith("{"):  # past vLLM's log lines
            if not line:
                raise RuntimeError("vLLM's engine stopped (its log is above)")
        reply = json.loads(line)
        if reply["num_tokens"] != num_tokens:
            raise RuntimeError(f"vLLM gave {reply['num_tokens']} tokens, not {num_tokens}")
        return reply["whole"], reply["decode"]

    try:
        while (line := stdout.readline()) != "ready\n":  # past vLLM's log lines
            if not line:
                raise RuntimeError("vLLM's engine did not start (its log is above)")
        yield one_stream
    finally:
        stdin.close()
        child.wait(timeout=120)
