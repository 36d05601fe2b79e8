"""SIGTERM on a vLLM worker mid-stream drains as it does on the built-in one: what it
finishes within its drain timeout finishes, the rest is handed back at once (not left to
its lease) and finishes on another worker, nothing lost or repeated; it exits 0 in time,
and vLLM's own processes (its engine core) go with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client, Handle
from producer.embedded import EmbeddedRedis
from shared.models import FinishReason, RequestState
from shared.settings import DEFAULT_MODEL
from tests.integration.conftest import FAULT_ENV, WorkerFactory
from tests.integration.faults import audit_stream, running_on, serving, wait_all_done, wait_until
from tests.integration.vllm_stack import (
    MAX_NUM_SEQS,
    REPO,
    START_TIMEOUT_S,
    VLLM_ENV,
    vllm_bin,
    worker_args,
)
from worker.vllm_engine.guard import descendants

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKLOAD = REPO / "bench" / "workloads" / "mixed200.jsonl"
DRAIN_S = 3.0
# Past the drain: vLLM's teardown (it waits up to 5 s for its engine core to stop, then
# kills it) and the interpreter's exit.
EXIT_MARGIN_S = 12.0
# More than vLLM's batch and the worker's look-ahead: some wait in the queue meanwhile.
NUM_REQUESTS = MAX_NUM_SEQS + 4
# Long enough that several are still running when the drain timeout ends.
MAX_TOKENS = 96


def _bodies() -> list[dict[str, Any]]:
    lines = WORKLOAD.read_text().splitlines()[:NUM_REQUESTS]
    return [json.loads(line) for line in lines]


def _submit(client: Client, bodies: list[dict[str, Any]]) -> list[Handle]:
    return [
        client.submit(
            model=DEFAULT_MODEL,
            messages=body["messages"],
            priority=body["priority"],
            max_tokens=MAX_TOKENS,
            ignore_eos=True,
            temperature=0.0,
        )
        for body in bodies
    ]


def _start_vllm(url: str, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [str(vllm_bin("tokenq")), "worker", "--engine", "vllm", "--model", DEFAULT_MODEL]
    env = {**os.environ, **VLLM_ENV, **FAULT_ENV, "TOKENQ_DRAIN_TIMEOUT_S": str(DRAIN_S)}
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [*cmd, "--redis", url, *worker_args()], stdout=log, stderr=subprocess.STDOUT, env=env
        )


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _mid_stream(connection: redis.Redis, handles: list[Handle], pid: int) -> bool:
    """Whether the worker ``pid`` runs a request that has streamed a few tokens."""
    held = set(running_on(connection, [h.id for h in handles], pid))
    return any(h.status().num_generated >= 4 for h in handles if h.id in held)


def test_sigterm_drains_hands_back_and_exits_zero_with_vllms_processes(
    redis_server: EmbeddedRedis, start_worker: WorkerFactory, tmp_path: Path
) -> None:
    connection = redis.Redis.from_url(redis_server.url)
    connection.flushall()
    log_path = tmp_path / "vllm.log"
    vllm = _start_vllm(redis_server.url, log_path)
    try:
        wait_until(lambda: serving(connection, vllm.pid), START_TIMEOUT_S, "the vLLM worker")
        client = Client(connection=connection)
        handles = _submit(client, _bodies())
        wait_until(lambda: _mid_stream(connection, handles, vllm.pid), 600, "tokens")
        vllm_processes = [p for p in descendants(vllm.pid) if _alive(p)]
        assert vllm_processes  # its engine core, at least
        asked = time.monotonic()
        vllm.send_signal(signal.SIGTERM)
        assert vllm.wait(timeout=DRAIN_S + 60) == 0, log_path.read_text()[-3000:]
        took_s = time.monotonic() - asked
    finally:
        if vllm.poll() is None:
            vllm.kill()
    assert took_s < DRAIN_S + EXIT_MARGIN_S, took_s
    states = [h.status().state for h in handles]
    # Each one it held finished or went back to the queue as it stopped: none is left
    # running under a lease that would have to lapse first.
    assert RequestState.RUNNING not in states, states
    assert RequestState.QUEUED in states, "nothing was handed back"
    assert "handed back" in log_path.read_text()
    wait_until(lambda: not any(map(_alive, vllm_processes)), 15, "vLLM's processes to end")
    start_worker(env=FAULT_ENV)  # a built-in worker finishes what was handed back
    wait_all_done(client, [h.id for h in handles], 600)
    for handle in handles:
        _check_whole(connection, handle)
    connection.close()


def _check_whole(connection: redis.Redis, handle: Handle) -> None:
    """Its stream has every token once, in order, then the final; the result agrees."""
    result = handle.result(timeout=60)
    assert result.error is None and result.finish_reason is FinishReason.LENGTH
    assert len(result.token_ids) == MAX_TOKENS
    audit = audit_stream(connection, handle.id)
    assert audit.final is not None and audit.final.finish_reason is FinishReason.LENGTH
    assert audit.indexes_contiguous and audit.duplicated_tokens == 0
    assert audit.token_ids == list(result.token_ids)
    opening = audit.token_ids[:8]  # a resume that started over would say it again
    windows = [audit.token_ids[i : i + 8] for i in range(len(audit.token_ids) - 7)]
    assert windows.count(opening) == 1
