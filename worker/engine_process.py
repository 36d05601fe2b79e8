"""The engine in a process of its own (``tokenq worker --engine-process``).

In one process, the loop that steps the engine also admits requests (payload, chat
template, tokenizer), plans writes and acts on Redis's replies, and the claim and
write threads' Python shares its GIL: where the engine's host work fills a core (a
GPU's step, or ``bench/through_redis.py --timed-forward-ms 2`` on the CPU), all of
that comes out of the engine's time. Here the engine runs its own loop in a child
process, as vLLM's EngineCore runs beside its API server. The worker sends it
tokenized requests and aborts over a pipe; the child sends back each step's outputs
as soon as it has them, with the engine's figures. The worker keeps everything that
is Redis, and the tokenizer: a copy of the engine's, which the child saves when it
has loaded the model.

The worker validates each request with the engine's own ``InputProcessor`` before it
sends it, and counts its capacity the same way; the messages are typed
(``worker.engine_messages``).

What a user sees differently:
- a request the engine refuses for a reason of its own (an adapter it cannot take, a
  grammar that does not compile) ends with the same error, a step later;
- the child exits with the worker: on its stop, on the pipe's end, and on the
  worker's death (``PR_SET_PDEATHSIG``);
- a child that dies takes the worker down (exit 1). The leases it held lapse, and
  other workers resume its requests.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from shared.limits import ModelLimits
from shared.models import FinishReason
from worker.engine.config import EngineConfig
from worker.engine.errors import ModelLoadError
from worker.engine.input_processor import HeldCounts, InputProcessor
from worker.engine.outputs import RequestOutput
from worker.engine.prompt_tokens import TokenizerPrompts
from worker.engine.request import EngineRequest
from worker.engine_like import AdmissionError, EngineGone, admission_error
from worker.engine_messages import (
    AbortRequest,
    AddRequest,
    Failed,
    Loaded,
    Stepped,
    StepsRead,
    Stop,
    ToEngine,
)

log = logging.getLogger(__name__)

# The longest ``step`` waits for the child's next step before it lets the loop turn.
STEP_WAIT_S = 0.05
# How long an idle child waits for a message before it looks again.
IDLE_WAIT_S = 0.1
# The most steps the child runs ahead of what the worker has read: as in one process
# (``worker.service.MAX_STEPS_WRITING``), a cancel or a lost lease takes effect within
# a few steps, and a worker held up by Redis holds the engine back.
MAX_STEPS_AHEAD = 16
# The figures the heartbeat reads every few seconds go with a step at most this often.
SLOW_FIGURES_EVERY_S = 0.5
MAX_WARM = 256
PR_SET_PDEATHSIG = 1


class EngineProcessDied(EngineGone):
    pass


class EngineProcess(TokenizerPrompts):
    """The engine as the worker loop sees it (``worker.engine_like.EngineLike``), run in
    a child process (see the module docs); admission's tokenizer is here, in the
    worker's process."""

    def __init__(self, config: EngineConfig) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        level = logging.getLogger().level
        self._process = context.Process(
            target=serve,
            args=(config, child, level, os.getpid()),
            name="tokenq-engine",
            daemon=True,
        )
        self._process.start()
        child.close()
        try:
            loaded = self._loaded_engine()
            self.tokenizer = _tokenizer(loaded)
        except BaseException:  # a failed load, or Ctrl-C meanwhile: no child left behind
            self._process.kill()
            self._process.join()
            self._conn.close()
            raise
        self.config = loaded.config
        self.device = loaded.device
        shape = loaded.shape
        self.vocab_size = shape.vocab_size
        self.max_model_len = shape.max_model_len
        self.embedding_size = shape.embedding_size
        self.kv_cache_budget_bytes = shape.kv_cache_budget_bytes
        self.inputs = InputProcessor(shape, loaded.config, self.tokenizer)
        self._loaded = loaded
        self._unfinished: dict[str, bool] = {}  # request id -> resumed mid-answer
        self._stats: dict[str, float] = {}
        self._warm: list[str] = []
        self._loras: list[str] = []

    def _loaded_engine(self) -> Loaded:
        """What the child says once it has loaded the model; raises what it failed with."""
        try:
            first = self._conn.recv()
        except (EOFError, OSError) as e:
            self._process.join(5)
            raise EngineProcessDied(
                f"the engine process exited (code {self._process.exitcode}) before it loaded "
                "the model"
            ) from e
        if isinstance(first, Failed):
            raise ModelLoadError(first.reason) if first.load_error else RuntimeError(first.reason)
        loaded: Loaded = first
        return loaded

    def add_request(self, req: EngineRequest) -> None:
        """Validated here as the engine would (``RequestRefused`` naming the field at
        fault), then sent; a refusal of the engine's own comes back as the request's
        final output."""
        self.inputs.validate(req)
        self._send(AddRequest(req))
        self._unfinished[req.request_id] = req.resumed

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> None:
        self._send(AbortRequest(request_id, reason))

    def step(self) -> list[RequestOutput]:
        """What the engine's steps produced since the last call, waiting up to
        ``STEP_WAIT_S`` for the next one when none has come yet."""
        if not self._unfinished or not self._poll(STEP_WAIT_S):
            return []
        outputs: list[RequestOutput] = []
        num_read = 0
        while True:
            stepped: Stepped = self._recv()
            num_read += 1
            outputs += stepped.outputs
            self._stats = stepped.stats
            if stepped.warm is not None:
                self._warm = stepped.warm
            if stepped.loras is not None:
                self._loras = stepped.loras
            if not self._poll(0):
                break
        self._send(StepsRead(num_read))  # the child may run that many more steps
        for out in outputs:
            if out.finish_reason is not None:
                self._unfinished.pop(out.request_id, None)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self._unfinished)

    def num_free_slots(self, resumed: bool = False) -> int:
        """As ``Engine.num_free_slots``, counting what was sent and has not finished.
        The loop asks before every claim, busy or idle: a child found dead here stops
        the worker before it claims what it could not run."""
        if not self._process.is_alive():
            raise self._died()
        num_new = sum(not r for r in self._unfinished.values())
        return self.inputs.num_free_slots(HeldCounts(len(self._unfinished), num_new), resumed)

    def stats(self) -> dict[str, float]:
        """The engine's figures as its last step sent them; none running or waiting
        once everything sent has finished (an idle child sends nothing)."""
        stats = dict(self._stats)
        if not self._unfinished:
            stats.update(running=0, waiting=0)
        return stats

    def resident_loras(self) -> list[str]:
        return list(self._loras)

    def lora_rank_limit(self) -> int:
        return self._loaded.lora_rank_limit

    def warm_fingerprints(self, limit: int) -> list[str]:
        return self._warm[:limit]

    def limits(self, guided: bool) -> ModelLimits:
        return self.inputs.limits(guided)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the child once it has finished the step it runs (its pipe closed, so
        that a step it is sending ends it too)."""
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(Stop())
        self._conn.close()
        self._process.join(timeout_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def _send(self, message: ToEngine) -> None:
        try:
            self._conn.send(message)
        except (OSError, ValueError) as e:
            raise self._died() from e

    def _poll(self, timeout_s: float) -> bool:
        try:
            return self._conn.poll(timeout_s)
        except (OSError, ValueError) as e:
            raise self._died() from e

    def _recv(self) -> Any:
        try:
            return self._conn.recv()
        except (EOFError, OSError) as e:
            raise self._died() from e

    def _died(self) -> EngineProcessDied:
        self._process.join(5)
        return EngineProcessDied(f"the engine process exited (code {self._process.exitcode})")


def _tokenizer(loaded: Loaded) -> Any:
    """The worker's copy of the engine's tokenizer, from where the child saved it."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            loaded.tokenizer_dir, trust_remote_code=loaded.config.trust_remote_code
        )
    finally:
        shutil.rmtree(loaded.tokenizer_dir, ignore_errors=True)


def serve(config: EngineConfig, conn: Connection, log_level: int, parent_pid: int) -> None:
    """The child: load the engine, say so, then step it as long as the worker lives."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _exit_with_parent(parent_pid)
    # The worker drains on SIGINT/SIGTERM; this process stops when the worker says so.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from worker.engine import Engine
    from worker.model_store import resolve_model

    try:
        engine = Engine(replace(config, model=str(resolve_model(config.model))))
    except Exception as e:
        load_error = isinstance(e, ModelLoadError)
        conn.send(Failed(str(e) if load_error else f"{type(e).__name__}: {e}", load_error))
        return
    tokenizer_dir = tempfile.mkdtemp(prefix="tokenq-tokenizer-")
    engine.tokenizer.save_pretrained(tokenizer_dir)
    conn.send(
        Loaded(
            config=engine.config,
            device=engine.device,
            tokenizer_dir=tokenizer_dir,
            shape=engine.shape,
            lora_rank_limit=engine.lora_rank_limit(),
        )
    )
    with contextlib.suppress(EOFError, OSError):  # the worker is gone
        _loop(engine, conn)


def _loop(engine: Any, conn: Connection) -> None:
    inbox: queue.SimpleQueue[ToEngine] = queue.SimpleQueue()
    reader = threading.Thread(target=_read, args=(conn, inbox), name="tokenq-engine-inbox")
    reader.daemon = True
    reader.start()
    refused: list[RequestOutput] = []
    slow_at = 0.0
    unread = 0  # steps sent that the worker has not said it read
    while True:
        can_step = unread < MAX_STEPS_AHEAD and engine.has_unfinished_requests()
        try:
            message = inbox.get_nowait() if can_step or refused else inbox.get(timeout=IDLE_WAIT_S)
            while True:
                if isinstance(message, Stop):
                    return
                if isinstance(message, StepsRead):
                    unread -= message.num_steps
                else:
                    refusal = _apply(engine, message)
                    if refusal is not None:
                        refused.append(refusal)
                message = inbox.get_nowait()
        except queue.Empty:
            pass
        can_step = unread < MAX_STEPS_AHEAD and engine.has_unfinished_requests()
        if not (can_step or refused):
            continue
        outputs = refused + (engine.step() if can_step else [])
        refused = []
        now = time.monotonic()
        warm = loras = None
        if now - slow_at > SLOW_FIGURES_EVERY_S:
            warm, loras, slow_at = engine.warm_fingerprints(MAX_WARM), engine.resident_loras(), now
        if outputs or warm is not None:
            conn.send(Stepped(outputs, engine.stats(), warm, loras))
            unread += 1


def _read(conn: Connection, inbox: queue.SimpleQueue[ToEngine]) -> None:
    """Everything the worker sends, read as it comes: a step's outputs may fill the
    pipe while the worker is sending, and neither side must then wait on the other.
    The pipe's end reads as a stop."""
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError):
        inbox.put(Stop())


def _apply(engine: Any, message: AddRequest | AbortRequest) -> RequestOutput | None:
    """Act on one message of the worker's; a request the engine refuses gives its final."""
    if isinstance(message, AbortRequest):
        engine.abort_request(message.request_id, message.reason)
        return None
    req = message.request
    try:
        engine.add_request(req)
    except Exception as e:  # the engine or its grammar refused it, or failed on it
        return _refusal(req, admission_error(req.request_id, e))
    return None


def _refusal(req: EngineRequest, failed: AdmissionError) -> RequestOutput:
    return RequestOutput(
        request_id=req.request_id,
        index=len(req.output_token_ids),
        new_token_ids=[],
        text="",
        finish_reason=FinishReason.ERROR,
        logprobs=None,
        num_prompt_tokens=len(req.prompt_token_ids),
        num_output_tokens=len(req.output_token_ids),
        error=failed.error,
        refusal=failed.refusal,
    )


def _exit_with_parent(parent_pid: int) -> None:
    """Have Linux kill this process when the worker dies (SIGKILL included); a worker
    gone before that was set leaves it nothing to serve."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(0)
