"""Requests move between a built-in worker and a vLLM worker on the same model, each killed
mid-stream with SIGKILL: every request finishes, whole, its stream continuous; and the
vLLM worker's own processes die with it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from producer.client import Client, Handle
from producer.embedded import EmbeddedRedis
from shared.models import FinalEvent, TokenEvent
from shared.settings import DEFAULT_MODEL
from tests.integration.conftest import FAULT_ENV, WorkerFactory
from tests.integration.openai_stack import wait_for_limits
from tests.integration.vllm_stack import VLLM_ENV, vllm_bin, worker_args
from worker.vllm_engine.guard import descendants

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STORY = [{"role": "user", "content": "Write a short story about the ocean."}]
MAX_TOKENS = 400
NUM_REQUESTS = 4


def _wait_generated(handles: list[Handle], at_least: int, timeout_s: float = 600) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if all(h.status().num_generated >= at_least for h in handles):
            return
        time.sleep(0.2)
    pytest.fail(f"not every request reached {at_least} tokens in {timeout_s:.0f}s")


def _start_vllm(url: str, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [str(vllm_bin("tokenq")), "worker", "--engine", "vllm", "--model", DEFAULT_MODEL]
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [*cmd, "--redis", url, *worker_args()],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **VLLM_ENV, **FAULT_ENV},
        )


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_requests_resume_across_engines_with_nothing_lost_or_repeated(
    redis_server: EmbeddedRedis, start_worker: WorkerFactory, tmp_path: Path
) -> None:
    with Client(redis_server.url) as client:
        client.redis.flushall()
        builtin = start_worker("--kv-cache-mib", "64", env=FAULT_ENV)
        wait_for_limits(redis_server.url, DEFAULT_MODEL)
        handles = [
            client.submit(
                model=DEFAULT_MODEL,
                messages=STORY,
                max_tokens=MAX_TOKENS,
                ignore_eos=True,
                temperature=0.0,
            )
            for _ in range(NUM_REQUESTS)
        ]
        _wait_generated(handles, 40)
        builtin.send_signal(signal.SIGKILL)  # the built-in worker dies mid-stream
        builtin.wait(timeout=30)
        vllm = _start_vllm(redis_server.url, tmp_path / "vllm.log")
        try:
            _wait_generated(handles, 200)  # vLLM resumed them from what they kept
            vllm_processes = [p for p in descendants(vllm.pid) if _alive(p)]
            assert vllm_processes  # its engine core, at least
            vllm.send_signal(signal.SIGKILL)  # and it dies mid-stream too
            vllm.wait(timeout=30)
            give_up = time.monotonic() + 15
            while any(map(_alive, vllm_processes)) and time.monotonic() < give_up:
                time.sleep(0.2)
            assert not any(map(_alive, vllm_processes)), "vLLM's processes outlived it"
        finally:
            if vllm.poll() is None:
                vllm.kill()
        start_worker("--kv-cache-mib", "64", env=FAULT_ENV)  # a built-in one finishes them
        for handle in handles:
            _check_whole_and_continuous(handle)


def _check_whole_and_continuous(handle: Handle) -> None:
    result = handle.result(timeout=600)
    assert result.error is None and result.finish_reason.value == "length"
    assert len(result.token_ids) == MAX_TOKENS
    assert handle.status().attempts >= 3  # built-in, vLLM, built-in
    opening = list(result.token_ids[:8])  # a resume that restarted would say it again
    windows = [list(result.token_ids[i : i + 8]) for i in range(len(result.token_ids) - 7)]
    assert windows.count(opening) == 1
    token_ids: list[int] = []
    text = ""
    for entry in handle.stream(timeout=60):
        event = entry.event
        if isinstance(event, TokenEvent):
            assert event.index == len(token_ids)  # no gap, no duplicate
            token_ids += event.token_ids
            text += event.text
        elif isinstance(event, FinalEvent):
            break
    assert (token_ids, text) == (list(result.token_ids), result.text)
