"""The worker loop: claim what fits, step the engine, publish the step in one round trip."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from pydantic import ValidationError

from shared.keys import REQUEST_ID_RE, Keys, model_tag
from shared.models import FinishReason, GenerationRequest, TokenEvent, dumps
from shared.records import stream_event
from shared.scripts import Claimed, Scripts, claim_call, finish_call, parse_claim, publish_call
from shared.settings import Settings
from worker.engine import Engine, EngineRequest, RequestOutput
from worker.held import STATE_OF_REASON, Held

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5
LEASE_LOST, PUBLISHED, CANCEL_REQUESTED = 0, 1, 2


class WorkerService:
    """Feeds one engine from one model's queue and publishes what it produces."""

    def __init__(
        self, engine: Engine, connection: redis.Redis, settings: Settings, model: str,
        worker_id: str,
    ) -> None:  # fmt: skip
        self.engine = engine
        self.redis = connection
        self.settings = settings
        self.model = model
        self.worker_id = worker_id
        self.keys = Keys(settings.namespace)
        self.tag = model_tag(model)
        self.scripts = Scripts(connection)
        self.held: dict[str, Held] = {}
        self.held_lock = threading.Lock()
        self.stopping = threading.Event()
        self.num_generated_tokens = 0
        # Filled by the heartbeat thread, applied by the loop between steps.
        self.lost: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.cancelled: queue.SimpleQueue[str] = queue.SimpleQueue()

    def run(self, burst: bool = False, should_stop: Callable[[], bool] | None = None) -> None:
        """Serve until stopped; ``burst`` returns once the queue and the engine are empty."""
        stop = should_stop or self.stopping.is_set
        while not stop():
            self._apply_heartbeat_news()
            claimed = self.intake()
            if self.engine.has_unfinished_requests():
                self.publish(self.engine.step())
            elif not claimed:
                if burst and not self.redis.zcard(self.keys.queue(self.tag)):
                    return
                self.redis.blpop([self.keys.wakeup(self.tag)], timeout=IDLE_WAIT_S)

    def drain(self, timeout_s: float) -> None:
        """After a stop: keep stepping what is held, up to ``timeout_s``."""
        give_up = time.monotonic() + timeout_s
        while self.engine.has_unfinished_requests() and time.monotonic() < give_up:
            self._apply_heartbeat_news()
            self.publish(self.engine.step())

    def _apply_heartbeat_news(self) -> None:
        while not self.lost.empty():
            self._drop(self.lost.get())
        while not self.cancelled.empty():
            request_id = self.cancelled.get()
            if request_id in self.held:
                self.engine.abort_request(request_id, FinishReason.CANCELLED)

    def intake(self) -> int:
        """Claim as many requests as the engine has room for; returns how many."""
        free = self.engine.num_free_slots()
        if free <= 0 or self.stopping.is_set():
            return 0
        ids = self._valid_ids(self.redis.zrange(self.keys.queue(self.tag), 0, free - 1))
        if not ids:
            return 0
        call = claim_call(self.keys, self.settings, self.tag, self.worker_id, ids)
        claimed = parse_claim(self.scripts.run(call))
        for c in claimed:
            self._admit(c)
        return len(claimed)

    def _valid_ids(self, members: list[Any]) -> list[str]:
        """Queue members that are request ids; anything else was written by hand or by
        a broken client, and is taken off the queue so it cannot block it."""
        ids = [_text(m) for m in members]
        bad = [i for i in ids if REQUEST_ID_RE.match(i) is None]
        if bad:
            log.error("removing malformed queue entries %r", bad)
            self.redis.zrem(self.keys.queue(self.tag), *bad)
        return [i for i in ids if i not in bad]

    def _admit(self, claimed: Claimed) -> None:
        try:
            request = GenerationRequest.model_validate_json(claimed.payload)
        except ValidationError as e:
            self._fail_unreadable(claimed, e)
            return
        held = Held(claimed.request_id, claimed.lease_token, request)
        with self.held_lock:
            self.held[held.request_id] = held
        if claimed.num_generated:
            self._restore(held)
        try:
            self.engine.add_request(self._engine_request(held))
        except ValueError as e:
            self._finish_now(held, FinishReason.ERROR, str(e))

    def _engine_request(self, held: Held) -> EngineRequest:
        req = held.request
        if req.messages is not None:
            ids = self.engine.encode_chat([m.model_dump() for m in req.messages])
        else:
            ids = self.engine.encode_prompt(req.prompt or "")
        held.num_prompt_tokens = len(ids)
        deadline = None if req.deadline_ms is None else req.deadline_ms / 1000
        return EngineRequest(
            request_id=held.request_id, prompt_token_ids=ids, sampling=req.sampling,
            priority=req.priority, output_token_ids=list(held.token_ids),
            deadline_unix_s=deadline,
        )  # fmt: skip

    def _restore(self, held: Held) -> None:
        """Take back what earlier attempts published, so generation resumes after it."""
        for entry_id, fields in self.redis.xrange(self.keys.stream(held.request_id)):
            event = stream_event(entry_id, fields).event
            if isinstance(event, TokenEvent):
                held.record(list(event.token_ids), event.text)

    def publish(self, outputs: list[RequestOutput]) -> None:
        """One pipelined round trip: every token event and final event of the step."""
        pipe = self.redis.pipeline(transaction=False)
        sent: list[tuple[str, Held]] = []
        for out in outputs:
            held = self.held.get(out.request_id)
            if held is None:
                continue
            if out.new_token_ids or out.text:
                self._queue_tokens(pipe, held, out)
                sent.append(("publish", held))
            if out.finish_reason is not None:
                self._queue_finish(pipe, held, out.finish_reason)
                sent.append(("finish", held))
        if sent:
            self._settle(sent, pipe.execute())

    def _queue_tokens(self, pipe: Any, held: Held, out: RequestOutput) -> None:
        event = TokenEvent(
            index=out.index, token_ids=tuple(out.new_token_ids), text=out.text,
            logprobs=tuple(out.logprobs) if out.logprobs else None,
        )  # fmt: skip
        held.record(out.new_token_ids, out.text)
        self.num_generated_tokens += len(out.new_token_ids)
        call = publish_call(self.keys, held.request_id, held.lease_token, dumps(event), len(out.new_token_ids))
        self.scripts.run(call, pipe)

    def _queue_finish(self, pipe: Any, held: Held, reason: FinishReason, error: str | None = None) -> None:
        state = STATE_OF_REASON[reason].value
        call = finish_call(
            self.keys, self.settings, held.request_id, held.lease_token,
            dumps(held.final(reason, error)), held.output_json(), state,
        )  # fmt: skip
        self.scripts.run(call, pipe)
        with self.held_lock:
            self.held.pop(held.request_id, None)

    def _settle(self, sent: list[tuple[str, Held]], replies: list[Any]) -> None:
        for (kind, held), reply in zip(sent, replies, strict=True):
            if reply == LEASE_LOST:
                log.warning("lease on %s lost; dropping it (another worker resumes it)", held.request_id)
                self._drop(held.request_id)
            elif kind == "publish" and reply == CANCEL_REQUESTED:
                self.engine.abort_request(held.request_id, FinishReason.CANCELLED)

    def _drop(self, request_id: str) -> None:
        with self.held_lock:
            gone = self.held.pop(request_id, None)
        if gone is not None:
            self.engine.abort_request(request_id, FinishReason.CANCELLED)

    def _finish_now(self, held: Held, reason: FinishReason, error: str | None) -> None:
        pipe = self.redis.pipeline(transaction=False)
        self._queue_finish(pipe, held, reason, error)
        pipe.execute()

    def _fail_unreadable(self, claimed: Claimed, error: ValidationError) -> None:
        log.error("request %s has an unreadable payload: %s", claimed.request_id, error)
        stub = GenerationRequest(model=self.model, prompt="unreadable")
        held = Held(claimed.request_id, claimed.lease_token, stub)
        self._finish_now(held, FinishReason.ERROR, f"unreadable payload: {error}")

    def held_leases(self) -> dict[str, str]:
        with self.held_lock:
            return {rid: h.lease_token for rid, h in self.held.items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

