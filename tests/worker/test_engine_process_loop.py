"""The engine process's loop (``worker/engine_process.py``) with a stand-in engine: it
reads what the worker sends while its own outputs fill the pipe, so neither side ever
waits on the other; it answers a refusal with the request's error final; it stops at the
worker's word or the pipe's end."""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import replace
from typing import Any

from shared.models import FinishReason, SamplingParams
from worker.engine.outputs import RequestOutput
from worker.engine.request import EngineRequest
from worker.engine_messages import AbortRequest, AddRequest, Stepped, Stop
from worker.engine_process import _loop


class FloodingEngine:
    """Holds every request it is given; each step gives each a large output."""

    def __init__(self, refuse: str = "") -> None:
        self.held: list[str] = []
        self.refuse = refuse

    def has_unfinished_requests(self) -> bool:
        return bool(self.held)

    def add_request(self, req: EngineRequest) -> None:
        if req.request_id == self.refuse:
            raise ValueError("its context is too long")
        self.held.append(req.request_id)

    def abort_request(self, request_id: str, reason: FinishReason) -> None:
        self.held.remove(request_id)

    def step(self) -> list[RequestOutput]:
        time.sleep(0.001)
        return [
            RequestOutput(rid, 0, [1] * 4_000, "x" * 40_000, None, None, 1, 1)
            for rid in self.held[:4]
        ]

    def stats(self) -> dict[str, float]:
        return {"running": len(self.held)}

    def warm_fingerprints(self, limit: int) -> list[str]:
        return []

    def resident_loras(self) -> list[str]:
        return []


def request(request_id: str, num_tokens: int = 1) -> EngineRequest:
    return EngineRequest(request_id, list(range(num_tokens)), SamplingParams(max_tokens=1))


def run_loop(engine: Any) -> tuple[Any, threading.Thread]:
    worker_end, engine_end = multiprocessing.Pipe()
    loop = threading.Thread(target=_loop, args=(engine, engine_end), daemon=True)
    loop.start()
    return worker_end, loop


def read_until_stopped(worker_end: Any, loop: threading.Thread) -> list[Stepped]:
    """What the loop sends until it ends (it may be waiting to send when told to stop)."""
    got: list[Stepped] = []
    give_up = time.monotonic() + 30
    while loop.is_alive() and time.monotonic() < give_up:
        if worker_end.poll(0.05):
            got.append(worker_end.recv())
    assert not loop.is_alive(), "the loop did not stop"
    return got


def test_the_worker_sends_while_the_engine_outputs_fill_the_pipe() -> None:
    engine = FloodingEngine()
    worker_end, loop = run_loop(engine)
    big = request("r", num_tokens=50_000)  # ~200 KB a request on the pipe
    sends = threading.Thread(
        target=lambda: [
            worker_end.send(AddRequest(replace(big, request_id=f"r{i}"))) for i in range(40)
        ]
    )
    sends.start()
    sends.join(timeout=30)
    assert not sends.is_alive(), "the worker's sends waited on the engine's outputs"
    worker_end.send(Stop())
    steps = read_until_stopped(worker_end, loop)
    assert len(engine.held) == 40 and steps


def test_a_refused_request_comes_back_as_its_error_final_and_the_pipe_end_stops_the_loop() -> None:
    engine = FloodingEngine(refuse="r1")
    worker_end, loop = run_loop(engine)
    worker_end.send(AddRequest(request("r0")))
    worker_end.send(AddRequest(request("r1", num_tokens=3)))
    worker_end.send(AbortRequest("r0", FinishReason.CANCELLED))
    give_up = time.monotonic() + 10
    refusal = None
    while refusal is None and time.monotonic() < give_up:
        stepped: Stepped = worker_end.recv()
        finals = [out for out in stepped.outputs if out.request_id == "r1"]
        refusal = finals[0] if finals else None
    assert refusal is not None
    assert refusal.finish_reason is FinishReason.ERROR and refusal.new_token_ids == []
    assert refusal.error == "cannot run this request: its context is too long"
    assert refusal.num_prompt_tokens == 3
    worker_end.close()  # the worker is gone
    loop.join(timeout=10)
    assert not loop.is_alive()
