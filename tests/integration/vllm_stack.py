"""One vLLM worker for the whole test run (its first start compiles for minutes here),
on a redis-server of its own, with a gateway; and vLLM's own answers to compare with.

The worker runs from ``.venv-vllm`` (``make vllm-setup``), where vLLM and the transformers
it allows live; the tests run here and reach it through Redis and the gateway.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.embedded import EmbeddedRedis
from shared.limits import registered_limits
from shared.settings import DEFAULT_MODEL
from tests.producer.gateway.process import started_gateway
from worker.vllm_engine.config import DEFAULT_ENGINE_ARGS

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO / ".venv-vllm"
REFERENCE_SCRIPT = REPO / "bench" / "vllm_generate.py"
# The engine arguments the worker and the reference share: a small batch, so that
# requests queue inside vLLM; float32, the checkpoint's dtype; eager, so that a test run
# starts in under a minute rather than compiling for several (bench/ runs it compiled).
MAX_NUM_SEQS = 8
ENGINE_ARGS: dict[str, Any] = {
    "max_model_len": 2048,
    "max_num_seqs": MAX_NUM_SEQS,
    "dtype": "float32",
    "enforce_eager": True,
}
# The LoRA tests' worker: the same, with LoRA on (vLLM then scores no prompts).
MAX_LORA_RANK = 8
LORA_ENGINE_ARGS = {
    **ENGINE_ARGS,
    "enable_lora": True,
    "max_loras": 2,
    "max_lora_rank": MAX_LORA_RANK,
}
# What the worker sets itself and the reference must set too: structured outputs as the
# worker makes them (its default engine arguments).
REFERENCE_ONLY = {"structured_outputs_config": DEFAULT_ENGINE_ARGS["structured_outputs_config"]}
# Little memory: other tests and helpers share this machine.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
START_TIMEOUT_S = 1200.0  # a first start compiles the model (minutes on two cores)


@dataclass
class VllmStack:
    redis_url: str
    gateway_url: str
    worker: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def alive(self) -> bool:
        return self.worker.poll() is None


def vllm_bin(name: str) -> Path:
    """A command of ``.venv-vllm``; fails the test (never skips) when it is missing."""
    path = VLLM_VENV / "bin" / name
    if not path.exists():
        pytest.fail(f"{VLLM_VENV} is missing: run  make vllm-setup  (vLLM's CPU build)")
    return path


def worker_args(engine_args: dict[str, Any] = ENGINE_ARGS) -> list[str]:
    """``engine_args`` as the worker's flags."""
    flags = []
    for key, value in engine_args.items():
        flag = f"--{key.replace('_', '-')}"
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def start_stack(tmp: Path, engine_args: dict[str, Any] = ENGINE_ARGS) -> Iterator[VllmStack]:
    """A redis-server, a gateway and ``tokenq worker --engine vllm`` on the default model
    (from .venv-vllm) with ``engine_args``, once the worker serves; all stopped after."""
    tokenq = vllm_bin("tokenq")
    server = EmbeddedRedis().start()
    if server.kind != "redis-server":
        server.stop()
        pytest.fail("redis-server is not installed: run  apt-get install -y redis-server")
    log_path = tmp / "vllm-worker.log"
    cmd = [str(tokenq), "worker", "--engine", "vllm", "--model", DEFAULT_MODEL]
    cmd += ["--redis", server.url, *worker_args(engine_args)]
    try:
        with log_path.open("wb") as log, started_gateway(server.url) as (url, _):
            worker = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **VLLM_ENV}
            )
            stack = VllmStack(server.url, url, worker, log_path)
            try:
                wait_until_serving(stack)
                yield stack
            finally:
                stop(worker)
    finally:
        server.stop()


def wait_until_serving(stack: VllmStack) -> None:
    give_up = time.monotonic() + START_TIMEOUT_S
    with redis.Redis.from_url(stack.redis_url) as connection:
        while time.monotonic() < give_up:
            if not stack.alive():
                pytest.fail(f"the vLLM worker exited:\n{stack.log_tail()}")
            if registered_limits(connection, DEFAULT_MODEL) is not None:
                return
            time.sleep(0.5)
    pytest.fail(f"the vLLM worker did not serve in {START_TIMEOUT_S:.0f}s:\n{stack.log_tail()}")


def stop(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM (it drains), then SIGKILL if it lingers."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=30)


def vllm_reference(
    model_dir: Path,
    cases: list[dict[str, Any]],
    tmp: Path,
    engine_args: dict[str, Any] = ENGINE_ARGS,
) -> list[dict[str, Any]]:
    """vLLM's own ``LLM.generate`` on ``cases`` (``bench/vllm_generate.py``, in .venv-vllm),
    with the worker's ``engine_args``: per case its tokens, text, logprobs, finish and
    prompt logprobs (a case may name an adapter and structured outputs, as that script
    reads them)."""
    python = vllm_bin("python")
    cases_path, out_path = tmp / "cases.jsonl", tmp / "reference.json"
    cases_path.write_text("".join(json.dumps(case) + "\n" for case in cases))
    args = {**REFERENCE_ONLY, **engine_args}
    pairs = [f"{key}={json.dumps(value)}" for key, value in args.items()]
    cmd = [str(python), str(REFERENCE_SCRIPT), str(model_dir), str(cases_path), str(out_path)]
    done = subprocess.run(
        [*cmd, *pairs],
        capture_output=True,
        env={**os.environ, **VLLM_ENV, "PYTHONPATH": str(REPO)},
        timeout=START_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"vLLM's reference run failed:\n{done.stderr.decode()[-3000:]}")
    results: list[dict[str, Any]] = json.loads(out_path.read_text())["results"]
    return results
