"""The worker loop: claim what fits, step the engine, publish the step in one round trip."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent import futures
from typing import Any

import redis
from pydantic import ValidationError

from shared.cache_scope import cache_salt
from shared.connection import UNREACHABLE, Backoff
from shared.errors import ReplicationTimeout
from shared.models import FinalEvent, FinishReason, GenerationRequest
from shared.ops.claim import Claimed
from shared.ops.moves import Fate
from shared.ops.publish import Finish, Written
from shared.ops.warm import MAX_WARM
from shared.prefixes import fingerprints
from shared.refusal import Refusal
from shared.settings import Settings
from worker.admission import engine_request, restore
from worker.coalesce import Coalescer
from worker.engine.outputs import RequestOutput
from worker.engine_like import EngineGone, EngineLike, admission_error
from worker.held import Held
from worker.ledger import RENEWED, Ledger, News, Run, Stage
from worker.metrics import WorkerMetrics
from worker.prefix_cuts import PrefixCuts
from worker.publisher import Action, Planned, finish_of, plan_step, settle
from worker.queue import ModelQueue
from worker.tokenizing import TOKENIZER_TASKS, tokenizer_answer
from worker.traces import worker_traces

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5
# Redis away (or failing over), or fewer replicas than TOKENQ_REDIS_MIN_REPLICAS: the
# loop pauses and tries again; nothing it holds is lost meanwhile.
REDIS_ERRORS = (*UNREACHABLE, ReplicationTimeout)
# Engine steps a write may overlap before the loop waits for Redis to acknowledge it.
MAX_STEPS_WRITING = 4
# While the batch and its look-ahead are full, a claim can bring only a request resumed
# mid-answer (into the rows kept for those): rare, so the loop looks for one this often
# rather than at every step, where each look would be a round trip for nothing, and the
# claimer's Python time beside the engine's.
RESUMED_POLL_S = 0.2


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
        guided: bool = True,
    ) -> None:
        self.engine = engine
        self.guided = guided  # it serves structured outputs (its grammar backend works)
        self.settings = settings
        self.model = model
        self.worker_id = worker_id
        self.metrics = metrics or WorkerMetrics(model)
        self.queue = ModelQueue(connection, settings, model, worker_id)
        # Every run of a request this worker holds, from its claim to its end.
        self.ledger = Ledger()
        self.stopping = threading.Event()
        self.num_generated_tokens = 0
        # Step outputs held for the next write, and a write not yet acknowledged.
        self.coalescer = Coalescer(settings.publish_coalesce_ms / 1000)
        self.pending: list[RequestOutput] = []
        self.writing: futures.Future[list[tuple[Planned, Written]]] | None = None
        self.steps_writing = 0  # engine steps computed while that write was in flight
        # Off: lock-step, each write acted on after the one step it overlaps and claims
        # made between steps (the protocol's tests step the loop so, one turn at a time).
        self.overlap_redis = True
        # When the loop last turned: past TOKENQ_WORKER_STALL_LIMIT_MS, leases lapse.
        self.last_turn_s = time.monotonic()
        # Writes go to Redis from this thread while the engine computes the next step.
        self.writer = futures.ThreadPoolExecutor(1, thread_name_prefix="tokenq-write")
        # Claims go out from this thread while the engine computes (see ``intake``).
        self.claimer = futures.ThreadPoolExecutor(1, thread_name_prefix="tokenq-claim")
        self.claiming: futures.Future[list[Claimed]] | None = None
        self.next_resumed_poll_s = 0.0  # with no room for new work, claims wait till then
        self._rate = (0, time.monotonic())  # tokens and when, at the last figures
        self.prefix_cuts = PrefixCuts(engine) if settings.prefix_affinity else None
        self.traces = worker_traces(engine, worker_id)  # None: tracing is off

    @property
    def held(self) -> dict[str, Held]:
        """The records of the runs the engine runs for this worker, by request id."""
        return self.ledger.held

    def run(self, burst: bool = False) -> None:
        """Serve until stopped; ``burst`` returns once the queue and the engine are empty.
        Redis going away pauses the loop (with backoff), never the process."""
        backoff, failing = Backoff(), False
        while not self.stopping.is_set():
            try:
                if not self.iterate(burst):
                    return
                if failing:
                    self.queue.recovered()
                backoff.reset()
                failing = False
            except REDIS_ERRORS as e:
                log.warning("Redis unreachable (%s); retrying in %.1fs", e, backoff.next_s)
                self.queue.refresh()
                failing = True
                backoff.wait()

    def iterate(self, burst: bool = False) -> bool:
        """One turn of the loop; False when a burst run has nothing left to do."""
        self.last_turn_s = time.monotonic()
        if self.pending and self.writing is None:
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
        if burst and not self.queue.can_serve_queued(self.engine.lora_rank_limit(), self.guided):
            return False
        self.queue.wait_for_work(IDLE_WAIT_S)
        return True

    def drain(self, timeout_s: float) -> None:
        """After a stop: keep stepping what is held, up to ``timeout_s``; hand back
        whatever is left so that it resumes on another worker."""
        give_up = time.monotonic() + timeout_s
        backoff = Backoff()
        with contextlib.suppress(*REDIS_ERRORS):
            self._admit_all(self._claimed(wait=True))  # drained, or handed back, with the rest
        while self.engine.has_unfinished_requests() and time.monotonic() < give_up:
            self.last_turn_s = time.monotonic()
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
        """Stop the writer thread once the write in flight, if any, is done (``drain``
        and a burst run end with every write acknowledged) and the claimer."""
        self.writer.shutdown()
        self.claimer.shutdown()

    def release_all(self) -> int:
        held = self.ledger.release_all()
        if not held:
            return 0
        released = sum(m.fenced for m in self.queue.release(held))
        log.info("handed back %d request(s) to the queue", released)
        if self.traces is not None:
            self.traces.ended_all("handed back")
        return released

    def step(self) -> None:
        """One engine step while, on the writer thread, Redis takes what earlier steps
        produced (if a write is due). At most one write is in flight: it is acted on at
        the first step after Redis acknowledged it, so a write slower than a step (a
        busy Redis, a large batch's events) holds back the next write, not the engine,
        for up to ``MAX_STEPS_WRITING`` steps (then the loop waits for it: a cancel or a
        lost lease that its reply brings is acted on that many steps late at most).
        What the steps meanwhile produce is held for the write after it. A write that
        failed is sent again, unchanged, before the engine moves on (``iterate``).
        Claims go out beside the steps too (``intake``)."""
        self._settle_written(wait=self.steps_writing >= MAX_STEPS_WRITING)
        if self.writing is None:
            pending = self._take(force=False)
            if pending is not None:
                # Planned here, where ``held`` changes; the writer thread only sends it.
                self.writing = self.writer.submit(self.queue.write, plan_step(self.held, pending))
                self.steps_writing = 0
            elif self.queue.unsettled and not self.coalescer.holding:
                # What ended rides the next write; with nothing held, none is coming soon.
                self.writing = self.writer.submit(self._settle_alone)
                self.steps_writing = 0
        try:
            self.steps_writing += 1
            self._step_engine()
        except BaseException:
            if self.writing is not None:
                futures.wait([self.writing])  # the engine's error is the one to raise
            raise
        if not self.overlap_redis:
            self._settle_written(wait=True)

    def _settle_written(self, wait: bool) -> None:
        """Act on the write in flight once Redis acknowledged it (``wait``: wait for
        that). A write's error raises here; what it carried stays pending and goes
        again, unchanged."""
        write = self.writing
        if write is None or not (wait or write.done()):
            return
        self.writing = None
        self._settle(write.result())

    def _step_engine(self) -> None:
        clock = self.coalescer.clock  # one clock for the step time and the window
        started = clock()
        outputs = self.engine.step()
        # A run handed back publishes nothing more here, its last output included (a
        # claim of its id waiting would otherwise take it for its own).
        ours = [o for o in outputs if not self.ledger.handed_back(o.request_id)]
        self.coalescer.add(ours, step_s=clock() - started)
        if self.traces is not None:
            self.traces.stepped(outputs)
        for out in outputs:
            if out.finish_reason is not None:
                self._engine_let_go(out)

    def _engine_let_go(self, out: RequestOutput) -> None:
        run = self.ledger.engine_let_go(out.request_id)
        if run is not None and run.held is not None:
            run.held.num_prefix_queried_tokens = out.num_prefix_queried_tokens
            run.held.num_prefix_hit_tokens = out.num_prefix_hit_tokens
        if self.traces is not None:
            self.traces.left_engine(out.request_id)

    def flush(self, force: bool = False) -> None:
        """Write what is held, if it is due (or ``force``): every token and final event
        in one round trip, once the write in flight is acknowledged. A write that failed
        is sent again first, unchanged. With ``force``, what the writes ended is settled
        too, rather than left for a next write."""
        self._settle_written(wait=True)
        pending = self._take(force)
        if pending is not None:
            self._settle(self.queue.write(plan_step(self.held, pending)))
        if force:
            self.queue.settle()  # nothing left for a next write to carry

    def _settle_alone(self) -> list[tuple[Planned, Written]]:
        """A write of nothing but what earlier writes ended (on the writer thread)."""
        self.queue.settle()
        return []

    def _take(self, force: bool) -> list[RequestOutput] | None:
        """What the next write carries: the one that failed, else what is held if due."""
        if not self.pending:
            if not self.coalescer.holding or not (force or self.coalescer.due()):
                return None
            self.pending = self.coalescer.take()
            for out in self.pending:
                if out.finish_reason is not None:
                    self.ledger.finishing(out.request_id)
        return self.pending

    def _settle(self, pairs: list[tuple[Planned, Written]]) -> None:
        """Redis acknowledged the pending write: record it, and act on its replies."""
        self.pending = []
        now = time.monotonic()
        num_tokens = 0
        gaps: dict[str, str] = {}
        for planned, written in pairs:
            action = settle(planned, written)
            if action is Action.RESYNC:
                gaps[planned.held.request_id] = planned.held.lease_token
            num_tokens += self._act(planned, action, written, now)
        self.num_generated_tokens += num_tokens
        self.metrics.on_tokens(num_tokens, None)
        self.queue.hand_back_cut(gaps)

    def _act(self, planned: Planned, action: Action, written: Written, now_s: float) -> int:
        """Apply one acknowledged reply; returns how many tokens it published."""
        held, num_tokens = planned.held, 0
        run = self.ledger.run_of(held)
        if run is None:
            return 0  # about a run since settled or handed back: nothing to do
        if action not in (Action.DROP, Action.RESYNC):
            num_tokens = planned.num_tokens
            if held.last_token_s is not None and num_tokens:
                self.metrics.on_token_gap(now_s - held.last_token_s, num_tokens)
            held.last_token_s = now_s
        if action is Action.CANCEL:
            self._abort(run, FinishReason.CANCELLED)
        elif action is Action.DROP:
            log.warning("lease on %s lost; another worker resumes it", held.request_id)
            self._drop(run)
        elif action is Action.RESYNC:
            self._drop(run)
        elif action is Action.DONE and written.finished is not None:
            final = FinalEvent.model_validate_json(written.finished.final_json)
            self.metrics.on_finish(held.request.priority, final)
            self.metrics.on_tenant_usage(held.request.tenant, final.usage)
            self.metrics.on_tenant_prefix_cache(
                held.request.tenant, held.num_prefix_queried_tokens, held.num_prefix_hit_tokens
            )
            if self.traces is not None:
                self.traces.finished(held.request_id, final)
            if planned.output.error is not None and not run.engine_done:
                self._abort(run, FinishReason.ERROR)  # it failed on the way out
            self.ledger.hand_back(run)  # settled (HANDED_BACK until the engine lets go)
        return num_tokens

    def _apply_heartbeat_news(self) -> None:
        """What the heartbeat learned about the runs it renewed."""
        for run, news in self.ledger.take_news():
            if run.stage not in RENEWED:
                continue  # handed back by an earlier item (a lost lease and a cancel, say)
            if news is News.LOST:
                log.warning("lease on %s expired; it resumes elsewhere", run.request_id)
                self._drop(run)
            elif run.held is not None:  # in the engine: it ends there
                self._abort(run, FinishReason.CANCELLED)

    def _abort(self, run: Run, reason: FinishReason) -> None:
        """Ask the engine to end ``run`` (once)."""
        if not run.abort_asked:
            run.abort_asked = True
            self.engine.abort_request(run.request_id, reason)

    def _drop(self, run: Run) -> None:
        """``run`` is no longer this worker's: the engine ends it, nothing more of it is
        published, and a claim of its id waits for the engine to let go."""
        if self.traces is not None:
            self.traces.ended(run.request_id, "lease lost")
        if run.held is not None:
            self._abort(run, FinishReason.CANCELLED)
            self.coalescer.discard(run.request_id)
        self.ledger.hand_back(run)

    def intake(self) -> int:
        """Claim as many requests as the engine has room for; returns how many were
        admitted. While the engine has work, the claim goes out on its own thread beside
        the next step, and what it brings is admitted on the turn after: its round trips
        never hold up the engine (its leases are renewed from the claim's return, should
        the step under way outlast a lease). An idle engine claims and admits at once.

        Requests put back after their worker died come first in the queue, and a
        client is reading each of them mid-answer: they are claimed into the rows the
        engine keeps for them even when its batch is full of new work, so their
        streams go silent for about one lease, not until a row frees up somewhere. While
        there is room for nothing else, the loop looks for them every ``RESUMED_POLL_S``
        rather than at every step."""
        claimed = self._claimed(wait=not self.engine.has_unfinished_requests())
        self._admit_all(claimed)
        room = self.engine.num_free_slots(resumed=True)
        if self.claiming is not None or room <= 0 or self.stopping.is_set():
            return len(claimed)
        free = self.engine.num_free_slots()
        if free == 0:
            now_s = self.coalescer.clock()
            if now_s < self.next_resumed_poll_s:
                return len(claimed)
            self.next_resumed_poll_s = now_s + RESUMED_POLL_S
        args = (room, free, self.engine.lora_rank_limit(), self.guided)
        if self.overlap_redis and self.engine.has_unfinished_requests():
            self.claiming = self.claimer.submit(self._claim_in_flight, *args)
            return len(claimed)
        now = self._claim(*args)
        self._admit_all(now)
        return len(claimed) + len(now)

    def _claimed(self, wait: bool) -> list[Claimed]:
        """What the claim in flight brought, once it is back (``wait``: wait for it).
        Its error raises here."""
        claim = self.claiming
        if claim is None or not (wait or claim.done()):
            return []
        self.claiming = None
        return claim.result()

    def _claim_in_flight(
        self, room: int, free: int, max_lora_rank: int, guided: bool
    ) -> list[Claimed]:
        """A claim on the claimer thread. What it took is renewed by the heartbeat from
        the moment it returns (the ledger has it CLAIMED), though the loop admits it only
        after the step under way: on a loaded host a step can outlast a lease, and a
        lease lapsed there would take a request from a live worker (and an attempt with
        it) for nothing."""
        return self._claim(room, free, max_lora_rank, guided)

    def _claim(self, room: int, free: int, max_lora_rank: int, guided: bool) -> list[Claimed]:
        started_ns = time.time_ns()
        claimed = self.queue.claim(room, free, max_lora_rank, guided)
        self.ledger.claim(claimed)
        if self.traces is not None:
            self.traces.claimed(claimed, started_ns)
        return claimed

    def _admit_all(self, claimed: list[Claimed]) -> None:
        self.metrics.on_claimed(sum(c.by_affinity for c in claimed))
        runs = self.ledger.to_admit(claimed)
        for at, run in enumerate(runs):
            try:
                self._admit(run)
            except BaseException:
                self.ledger.abandon(runs[at:])  # their leases lapse: none of them runs here
                raise

    def _admit(self, run: Run) -> None:
        """Hand a claimed request to the engine. If Redis fails before the engine has it,
        its lease is no longer renewed (``_admit_all``): it lapses and the reaper puts the
        request back, so nothing is kept alive that will never run. A request claimed
        again while the engine still runs an earlier run of it here waits for the engine
        to let go of that run (the engine would take the two runs for one); that earlier
        run's lease was taken, or this claim could not have been made: it is handed back."""
        earlier = self.ledger.in_engine(run.request_id)
        if earlier is not None and earlier.stage in (Stage.RUNNING, Stage.FINISHING):
            self._drop(earlier)
        if self.ledger.in_engine(run.request_id) is not None:
            self.ledger.wait(run)
            return
        claimed = run.claimed
        started_ns = time.time_ns()
        try:
            request = GenerationRequest.model_validate_json(claimed.payload)
        except ValidationError as e:
            self._dead_letter(run, e)
            return
        if request.task in TOKENIZER_TASKS:
            self._answer_now(run, Held(claimed.request_id, claimed.lease_token, request))
            return
        salt = cache_salt(request, self.settings)
        fps = tuple(fingerprints(request, salt)) if self.prefix_cuts else ()
        held = Held(claimed.request_id, claimed.lease_token, request, fingerprints=fps)
        if claimed.num_generated and not self._restore(run, held):
            return
        try:
            self.engine.add_request(engine_request(self.engine, self.queue, held, self.prefix_cuts))
        except (*REDIS_ERRORS, EngineGone):
            raise  # not the request's fault: its lease lapses and it runs again
        except Exception as e:  # refused, or the worker's failure: this request's alone
            error, refusal = admission_error(held.request_id, e)
            if self.traces is not None:
                self.traces.admitted(claimed, held, started_ns, error)
            self._end_now(run, held, FinishReason.ERROR, error, refusal=refusal)
            return
        if self.traces is not None:
            self.traces.admitted(claimed, held, started_ns)
        self.ledger.admitted(run, held)

    def _answer_now(self, run: Run, held: Held) -> None:
        """A request for the tokenizer alone, answered and ended at once: the engine never
        sees it. What the tokenizer refuses ends it with that error."""
        try:
            final = tokenizer_answer(self.engine, held.request)
        except Exception as e:  # this request's alone, as at admission
            error, refusal = admission_error(held.request_id, e)
            self._end_now(run, held, FinishReason.ERROR, error, refusal=refusal)
            return
        output = held.output_json()
        self.queue.finish_now(held, Finish(held.request_id, held.lease_token, final, output,
                                           Fate.FINISHED))  # fmt: skip
        self.ledger.settle(run)

    def _restore(self, run: Run, held: Held) -> bool:
        """Take back what earlier attempts published; False when its stream cannot be
        read back (the request ends with that error, after whatever the stream holds)."""
        try:
            restore(self.queue, held)
        except REDIS_ERRORS:
            raise
        except Exception as e:
            log.warning("request %s: its stream cannot be read back: %r", held.request_id, e)
            error = f"internal error: cannot resume: its stream holds an unreadable entry ({e})"
            self._end_now(run, held, FinishReason.ERROR, error, whole_stream=True)
            return False
        return True

    def _end_now(
        self,
        run: Run,
        held: Held,
        reason: FinishReason,
        error: str,
        state: Fate | None = None,
        whole_stream: bool = False,
        refusal: Refusal | None = None,
    ) -> None:
        """End ``held`` before it ran here: a dead letter (or ``whole_stream``) whatever
        its stream holds, any other end once its stream holds what was restored (no gap
        before the final)."""
        num_published = None if state is Fate.DEAD or whole_stream else len(held.token_ids)
        finish = finish_of(held, reason, error, state, num_published, refusal)
        self.queue.finish_now(held, finish)
        self.ledger.settle(run)

    def _dead_letter(self, run: Run, error: ValidationError) -> None:
        log.error("request %s has an unreadable payload; dead-lettered", run.request_id)
        stub = GenerationRequest(model=self.model, prompt="(unreadable)")
        held = Held(run.request_id, run.lease_token, stub)
        self._end_now(run, held, FinishReason.ERROR, f"unreadable payload: {error}", Fate.DEAD)

    def warm_fingerprints(self) -> list[str]:
        """The prefix fingerprints this worker holds warm, for the heartbeat to publish,
        newest first: its held requests' (their prefill puts them in the cache; up to
        half the set), then those the engine holds cached."""
        if not self.prefix_cuts:
            return []
        held = self.ledger.fingerprints()
        cached = self.engine.warm_fingerprints(MAX_WARM)
        newest = list(dict.fromkeys(held))[: MAX_WARM // 2]
        return list(dict.fromkeys([*newest, *cached]))[:MAX_WARM]

    def figures(self) -> dict[str, Any]:
        """What the registry shows of this worker (refreshed on each heartbeat)."""
        stats = self.engine.stats()
        self.metrics.on_engine_stats(stats)
        now, tokens = time.monotonic(), self.num_generated_tokens
        last_tokens, last_s = self._rate
        self._rate = (tokens, now)
        queries = max(stats.get("prefix_cache_queries", 0), 1)
        return {
            "running": self.ledger.num_running,
            "tokens_per_s": round((tokens - last_tokens) / max(now - last_s, 1e-6), 1),
            "kv_cache_usage": round(stats.get("kv_cache_usage", 0.0), 3),
            "prefix_cache_hit_rate": round(stats.get("prefix_cache_hits", 0) / queries, 3),
            "state": "draining" if self.stopping.is_set() else "serving",
            "coalesce_p99_ms": round(self.coalescer.p99_delay_ms(), 1),
            "loras": ",".join(self.engine.resident_loras()),
            "affinity_claims": self.metrics.num_affinity_claims,
            "prefix_cache_queries": int(stats.get("prefix_cache_queries", 0)),
            "prefix_cache_hits": int(stats.get("prefix_cache_hits", 0)),
            "waiting": int(stats.get("waiting", 0)),  # in the engine's scheduler
            "preemptions": int(stats.get("preemptions", 0)),
            **_speculation(stats),
        }


def _speculation(stats: dict[str, float]) -> dict[str, float]:
    """Speculative decoding's acceptance (either engine), once it has drafted tokens."""
    if not stats.get("spec_decode_num_draft_tokens"):
        return {}
    return {"spec_acceptance_rate": round(stats["spec_decode_acceptance_rate"], 3)}
