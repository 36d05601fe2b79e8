"""The worker loop: claim what fits, step the engine, publish the step in one round trip."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from concurrent import futures
from typing import Any, Protocol

import redis
from pydantic import ValidationError

from shared.calls import Claimed
from shared.connection import UNREACHABLE, Backoff
from shared.flows import claim_flow, drive, fence_flow
from shared.keys import Keys, model_tag
from shared.models import FinalEvent, FinishReason, GenerationRequest
from shared.scripts import Scripts
from shared.settings import Settings
from worker.admission import engine_request, restore
from worker.claims import can_serve_queued, candidates, valid_ids
from worker.coalesce import Coalescer
from worker.engine.outputs import RequestOutput
from worker.engine.request import EngineRequest
from worker.held import Held
from worker.metrics import WorkerMetrics
from worker.publisher import Planned, end_call, finish_now, plan_step, send_step, settle

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5
REDIS_ERRORS = UNREACHABLE


class EngineLike(Protocol):
    """What the loop needs of an engine: the real one or the simulation."""

    @property
    def vocab_size(self) -> int: ...
    def encode_prompt(self, prompt: str) -> list[int]: ...
    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = ...,
        template_kwargs: dict[str, Any] | None = ...,
    ) -> list[int]: ...
    def add_request(self, req: EngineRequest) -> None: ...
    def abort_request(self, request_id: str, reason: FinishReason = ...) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished_requests(self) -> bool: ...
    def num_free_slots(self, resumed: bool = False) -> int: ...
    def stats(self) -> dict[str, float]: ...
    def resident_loras(self) -> list[str]: ...
    def lora_rank_limit(self) -> int: ...


class WorkerService:
    """Feeds one engine from one model's queue and publishes what it produces."""

    def __init__(
        self,
        engine: EngineLike,
        connection: redis.Redis,
        settings: Settings,
        model: str,
        worker_id: str,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.engine = engine
        self.redis = connection
        self.settings = settings
        self.model = model
        self.worker_id = worker_id
        self.metrics = metrics or WorkerMetrics(model)
        self.keys = Keys(settings.namespace)
        self.tag = model_tag(model)
        self.scripts = Scripts(connection)
        self.held: dict[str, Held] = {}
        self.held_lock = threading.Lock()
        self.stopping = threading.Event()
        self.num_generated_tokens = 0
        # Step outputs held for the next write, and a write not yet acknowledged.
        self.coalescer = Coalescer(settings.publish_coalesce_ms / 1000)
        self.pending: list[RequestOutput] = []
        # Filled by the heartbeat thread, applied by the loop between steps.
        self.lost: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.cancelled: queue.SimpleQueue[str] = queue.SimpleQueue()
        # Writes go to Redis from this thread while the engine computes the next step.
        self.writer = futures.ThreadPoolExecutor(1, thread_name_prefix="tokenq-write")

    def run(self, burst: bool = False) -> None:
        """Serve until stopped; ``burst`` returns once the queue and the engine are empty.
        Redis going away pauses the loop (with backoff), never the process."""
        backoff = Backoff()
        while not self.stopping.is_set():
            try:
                if not self.iterate(burst):
                    return
                backoff.reset()
            except REDIS_ERRORS as e:
                log.warning("Redis unreachable (%s); retrying in %.1fs", e, backoff.next_s)
                backoff.wait()

    def iterate(self, burst: bool = False) -> bool:
        """One turn of the loop; False when a burst run has nothing left to do."""
        if self.pending:
            self.flush()  # a write that failed goes again, unchanged, before the engine moves on
        self._apply_heartbeat_news()
        claimed = self.intake()
        if self.engine.has_unfinished_requests():
            self.step()
            if not self.engine.has_unfinished_requests():
                self.flush(force=True)
            return True
        if claimed:
            return True
        self.flush(force=True)
        if burst and not can_serve_queued(
            self.redis, self.keys, self.tag, self.engine.lora_rank_limit()
        ):
            return False
        self.redis.blpop([self.keys.wakeup(self.tag)], timeout=IDLE_WAIT_S)
        return True

    def drain(self, timeout_s: float) -> None:
        """After a stop: keep stepping what is held, up to ``timeout_s``; hand back
        whatever is left so that it resumes on another worker."""
        give_up = time.monotonic() + timeout_s
        backoff = Backoff()
        while self.engine.has_unfinished_requests() and time.monotonic() < give_up:
            try:
                self.flush()
                self._apply_heartbeat_news()
                self.step()
            except REDIS_ERRORS:
                backoff.wait()
        with contextlib.suppress(*REDIS_ERRORS):
            self.flush(force=True)  # what was generated is not generated again elsewhere
        self.release_all()

    def close(self) -> None:
        """Stop the writer thread (nothing is in flight between steps)."""
        self.writer.shutdown()

    def release_all(self) -> int:
        held = self.held_leases()
        if not held:
            return 0
        flow = fence_flow(self.keys, self.settings, self.tag, held, "release")
        released = sum(m.fenced for m in drive(self.scripts, flow))
        log.info("handed back %d request(s) to the queue", released)
        with self.held_lock:
            self.held.clear()
        return released

    def step(self) -> None:
        """One engine step while, on the writer thread, Redis takes what earlier steps
        produced (if a write is due). The write is acknowledged, and acted on, before
        this returns: at most one write is in flight, the engine runs at most one step
        past what Redis acknowledged, and a write that failed is sent again before the
        next step (``iterate``). Claims stay on this thread, right before the engine
        takes what they bring: a request claimed is held, and its lease renewed, from
        then on (a claim made beside a long step could see its lease lapse)."""
        pending = self._take(force=False)
        if pending is None:
            self._step_engine()
            return
        write = self.writer.submit(self._send, pending)
        try:
            self._step_engine()
        except BaseException:
            futures.wait([write])  # the engine's error is the one to raise
            raise
        self._settle(write.result())  # a write's error raises here; it goes again, unchanged

    def _step_engine(self) -> None:
        clock = self.coalescer.clock  # one clock for the step time and the window
        started = clock()
        outputs = self.engine.step()
        self.coalescer.add(outputs, step_s=clock() - started)

    def flush(self, force: bool = False) -> None:
        """Write what is held, if it is due (or ``force``): every token and final event
        in one round trip. A write that failed is sent again first, unchanged."""
        pending = self._take(force)
        if pending is not None:
            self._settle(self._send(pending))

    def _take(self, force: bool) -> list[RequestOutput] | None:
        """What the next write carries: the one that failed, else what is held if due."""
        if not self.pending:
            if not self.coalescer.holding or not (force or self.coalescer.due()):
                return None
            self.pending = self.coalescer.take()
            for out in self.pending:
                held = self.held.get(out.request_id) if out.finish_reason else None
                if held is not None:
                    held.ending = True
        return self.pending

    def _send(self, pending: list[RequestOutput]) -> list[tuple[Planned, Any]]:
        """The write's round trips, and which request each reply is about. On the writer
        thread it reads ``held`` while the loop only steps the engine (nothing changes
        ``held``, or what it holds, meanwhile)."""
        plan = plan_step(self.keys, self.settings, self.held, pending)
        return send_step(self.redis, self.scripts, self.keys, self.settings, self.tag, plan)

    def _settle(self, pairs: list[tuple[Planned, Any]]) -> None:
        """Redis acknowledged the pending write: record it, and act on its replies."""
        self.pending = []
        now = time.monotonic()
        num_tokens = 0
        for planned, reply in pairs:
            num_tokens += self._act(planned.held, settle(planned, reply), planned, reply, now)
        self.num_generated_tokens += num_tokens
        self.metrics.on_tokens(num_tokens, None)

    def _act(self, held: Held, action: str, planned: Planned, reply: Any, now_s: float) -> int:
        """Apply one acknowledged reply; returns how many tokens it published."""
        num_tokens = 0
        if action in ("ok", "cancel"):
            num_tokens = len(planned.output.new_token_ids)
            if held.last_token_s is not None and num_tokens:
                self.metrics.on_token_gap(now_s - held.last_token_s, num_tokens)
            held.last_token_s = now_s
        if action == "cancel":
            self._abort(held.request_id, FinishReason.CANCELLED)
        elif action == "drop":
            log.warning("lease on %s lost; another worker resumes it", held.request_id)
            self._drop(held.request_id)
        elif action == "done":
            final = FinalEvent.model_validate_json(reply)
            self.metrics.on_finish(held.request.priority, final)
            self.metrics.on_tenant_usage(held.request.tenant, final.usage)
            with self.held_lock:
                self.held.pop(held.request_id, None)
        return num_tokens

    def _apply_heartbeat_news(self) -> None:
        while not self.lost.empty():
            self._drop(self.lost.get())
        while not self.cancelled.empty():
            self._abort(self.cancelled.get(), FinishReason.CANCELLED)

    def _abort(self, request_id: str, reason: FinishReason) -> None:
        held = self.held.get(request_id)
        if held is not None and not held.aborting:
            held.aborting = True
            self.engine.abort_request(request_id, reason)

    def _drop(self, request_id: str) -> None:
        self._abort(request_id, FinishReason.CANCELLED)
        self.coalescer.discard(request_id)
        with self.held_lock:
            self.held.pop(request_id, None)

    def intake(self) -> int:
        """Claim as many requests as the engine has room for; returns how many.

        Requests put back after their worker died come first in the queue, and a
        client is reading each of them mid-answer: they are claimed into the rows the
        engine keeps for them even when its batch is full of new work, so their
        streams go silent for about one lease, not until a row frees up somewhere."""
        room = self.engine.num_free_slots(resumed=True)
        if room <= 0 or self.stopping.is_set():
            return 0
        free = self.engine.num_free_slots()
        heads = candidates(self.redis, self.keys, self.tag, room, free)
        ids = valid_ids(self.redis, self.keys, self.tag, heads)
        if not ids:
            return 0
        flow = claim_flow(
            self.keys, self.settings, self.tag, self.worker_id, ids, self.engine.lora_rank_limit()
        )
        claimed = drive(self.scripts, flow)
        for c in claimed:
            self._admit(c)
        return len(claimed)

    def _admit(self, claimed: Claimed) -> None:
        """Hand a claimed request to the engine. It is held (its lease renewed) only once
        the engine has it: if Redis fails before that, the lease lapses and the reaper
        puts the request back, so nothing is kept alive that will never run."""
        try:
            request = GenerationRequest.model_validate_json(claimed.payload)
        except ValidationError as e:
            self._dead_letter(claimed, e)
            return
        held = Held(claimed.request_id, claimed.lease_token, request)
        if claimed.num_generated:
            restore(self.redis, self.keys, held)
        try:
            self.engine.add_request(
                engine_request(self.engine, self.redis, self.keys, self.model, held)
            )
        except Exception as e:  # the tokenizer, its chat template or the engine refused it
            log.warning("request %s cannot run: %r", held.request_id, e)
            self._end_now(held, FinishReason.ERROR, f"cannot run this request: {e}")
            return
        with self.held_lock:
            self.held[held.request_id] = held

    def _end_now(
        self, held: Held, reason: FinishReason, error: str, state: str | None = None
    ) -> None:
        call = end_call(self.keys, self.settings, held, reason, error=error, state=state)
        finish_now(self.scripts, self.keys, self.settings, self.tag, held, call)
        with self.held_lock:
            self.held.pop(held.request_id, None)

    def _dead_letter(self, claimed: Claimed, error: ValidationError) -> None:
        log.error("request %s has an unreadable payload; dead-lettered", claimed.request_id)
        stub = GenerationRequest(model=self.model, prompt="(unreadable)")
        held = Held(claimed.request_id, claimed.lease_token, stub)
        self._end_now(held, FinishReason.ERROR, f"unreadable payload: {error}", state="dead")

    def ending(self, request_id: str) -> bool:
        """Whether a lease the heartbeat found gone needs no action: the request's finish
        is in a write (whose reply settles it), or it is no longer held."""
        held = self.held.get(request_id)
        return held is None or held.ending

    def held_leases(self) -> dict[str, str]:
        with self.held_lock:
            return {rid: h.lease_token for rid, h in self.held.items()}
