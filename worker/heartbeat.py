"""The heartbeat: renews leases, the registry entry and the served marker on its own
thread, so a slow model step never lets a lease lapse; and sweeps for requests
whose worker died."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import redis

from shared.connection import UNREACHABLE
from shared.errors import ReplicationTimeout
from worker.lease_keeper import LeaseKeeper
from worker.ledger import Ledger, Renewal
from worker.queue import ModelQueue

log = logging.getLogger(__name__)


class Holder(Protocol):
    """What the heartbeat needs of the worker loop it beats for."""

    stopping: threading.Event
    ledger: Ledger  # what it holds: the leases to renew, and where what was learned goes
    last_turn_s: float  # when (monotonic) the loop last turned

    def figures(self) -> dict[str, Any]: ...
    def warm_fingerprints(self) -> list[str]: ...


class Heartbeat(threading.Thread):
    """Renews on its own thread. A loop that holds the GIL starves it: ``keeper`` (a
    child process, worker/lease_keeper.py) renews then, told of each beat that got
    through. Both stop once the loop has not turned for TOKENQ_WORKER_STALL_LIMIT_MS."""

    def __init__(
        self,
        queue: ModelQueue,
        holder: Holder,
        info: dict[str, Any],
        keeper: LeaseKeeper | None = None,
    ) -> None:
        super().__init__(name="tokenq-heartbeat", daemon=True)
        self.queue = queue
        self.holder = holder
        self.info = info
        self.keeper = keeper
        self.done = threading.Event()
        settings = queue.settings
        self.interval_s = min(settings.lease_ms / 3, settings.worker_heartbeat_ms) / 1000
        self.stall_limit_s = settings.worker_stall_limit_ms / 1000  # 0: no bound
        self.stalled = False
        self.last_ok_s = 0.0  # monotonic time of the last beat Redis acknowledged
        self.failed_s = -float("inf")  # ... and of the last that failed

    def run(self) -> None:
        while not self.done.wait(self.interval_s):
            try:
                recovering = self.failed_s > self.last_ok_s
                self.beat()
                if recovering:
                    self.queue.recovered()
                if self.may_reap():
                    self.reap()
            except (*UNREACHABLE, redis.RedisError, ReplicationTimeout) as e:
                self.failed_s = time.monotonic()
                self.queue.refresh()
                log.warning("heartbeat failed (%s); retrying", e)

    def may_reap(self) -> bool:
        """Not for a lease after Redis was away (a restart, a failover): every live
        worker's leases lapsed meanwhile, and each needs a beat to renew them before
        anyone takes them for dead."""
        return time.monotonic() - self.failed_s > self.queue.settings.lease_ms / 1000

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=5)
        self.queue.deregister()

    def beat(self) -> Renewal:
        """One beat: renews the leases the ledger holds and returns what it renewed and
        learned (lost leases, cancels), handed to the ledger for the loop's next turn."""
        turn_age_s = time.monotonic() - self.holder.last_turn_s
        held = {} if self._stalled(turn_age_s) else self.holder.ledger.leases()
        fields = {**self.info, **self.holder.figures()}
        beat = self.queue.beat(held, fields, self.holder.warm_fingerprints())
        if self.keeper is not None:
            self.keeper.beaten(turn_age_s)
        now_s = time.monotonic()
        if self.last_ok_s and now_s - self.last_ok_s > 3 * self.interval_s + 1:
            self.failed_s = now_s  # Redis was away (its client retried through a failover)
        self.last_ok_s = now_s
        renewal = Renewal(held, beat.renewed, beat.cancelled)
        self.holder.ledger.renewed(renewal)
        self._obey(beat.order)
        return renewal

    def _stalled(self, turn_age_s: float) -> bool:
        """Whether the loop has not turned within the stall limit: a worker stuck for
        good lets its leases lapse, so that other workers take its requests."""
        stalled = bool(self.stall_limit_s) and turn_age_s > self.stall_limit_s
        if stalled != self.stalled:
            say = log.error if stalled else log.warning
            say("the loop %s; leases renewed: %s", *STALL_NEWS[stalled])
        self.stalled = stalled
        return stalled

    def _obey(self, order: str | None) -> None:
        """Operators drain a worker (dashboard, CLI) by writing 'drain' to its control key."""
        if order == "drain" and not self.holder.stopping.is_set():
            log.info("drain requested by an operator: no more claims; finishing what is held")
            self.holder.stopping.set()

    def healthy(self) -> bool:
        """Redis answered a recent beat."""
        return time.monotonic() - self.last_ok_s < 3 * self.interval_s + 1

    def reap(self) -> None:
        reaped = self.queue.reap()
        if reaped is not None and (reaped.requeued or reaped.dead or reaped.ended):
            log.info(
                "reaper: %d requeued, %d dead-lettered, %d ended (expired or cancelled)",
                reaped.requeued,
                reaped.dead,
                reaped.ended,
            )


STALL_NEWS = {
    True: ("made no turn within TOKENQ_WORKER_STALL_LIMIT_MS", "none (they lapse)"),
    False: ("turns again", "those still held"),
}


class LoadingBeat(threading.Thread):
    """While the model loads: the worker is in the registry (state ``loading``) and its
    model counts as served, so requests submitted meanwhile queue instead of being
    refused, and dashboards show the worker coming up."""

    def __init__(self, queue: ModelQueue, info: dict[str, Any]) -> None:
        super().__init__(name="tokenq-loading-beat", daemon=True)
        self.queue = queue
        self.info = {**info, "state": "loading"}
        self.done = threading.Event()

    def beat(self) -> None:
        self.queue.register(self.info)

    def run(self) -> None:
        while not self.done.wait(self.queue.settings.worker_heartbeat_ms / 1000):
            try:
                self.beat()
            except redis.RedisError as e:
                log.warning("registry beat while loading failed (%s); retrying", e)

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=5)
