"""The heartbeat: renews leases, the registry entry and the served marker on its own
thread, so a slow model step never lets a lease lapse; and sweeps for requests
whose worker died."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis
from redis.exceptions import NoScriptError

from shared.calls import renew_call
from shared.keys import Keys
from shared.reaper import reap_once
from shared.registry import register_worker
from shared.scripts import Scripts
from shared.settings import Settings
from worker.publisher import LEASE_LOST
from worker.service import WorkerService

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    def __init__(
        self, service: WorkerService, connection: redis.Redis, info: dict[str, Any]
    ) -> None:
        super().__init__(name="tokenq-heartbeat", daemon=True)
        self.service = service
        self.redis = connection
        self.scripts = Scripts(connection)
        self.info = info
        self.done = threading.Event()
        settings = service.settings
        self.interval_s = min(settings.lease_ms / 3, settings.worker_heartbeat_ms) / 1000
        self._last_tokens = 0
        self.last_ok_s = 0.0  # monotonic time of the last beat Redis acknowledged
        self._last_time = time.monotonic()

    def run(self) -> None:
        while not self.done.wait(self.interval_s):
            try:
                self.beat()
                self.reap()
            except redis.RedisError as e:
                log.warning("heartbeat failed (%s); retrying", e)

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=5)
        self.deregister()

    def beat(self) -> None:
        s = self.service
        held = s.held_leases()
        pipe = self.redis.pipeline(transaction=False)
        if held:
            # Leases on the model's slot; cancel flags on each request's own.
            self.scripts.run(renew_call(s.keys, s.settings, s.tag, held), pipe)
            for request_id in held:
                pipe.hget(s.keys.request(request_id), "cancel")
        self._register(pipe)
        pipe.get(s.keys.worker_control(s.worker_id))
        try:
            replies = pipe.execute()
        except NoScriptError:  # Redis restarted without its scripts: load them; next beat
            self.scripts.reload()
            raise
        self.last_ok_s = time.monotonic()
        if held:
            self._apply(list(held), replies[0], replies[1 : 1 + len(held)])
        self._obey(replies[-1])

    def _obey(self, order: bytes | None) -> None:
        """Operators drain a worker (dashboard, CLI) by writing 'drain' to its control key."""
        if order == b"drain" and not self.service.stopping.is_set():
            log.info("drain requested by an operator: no more claims; finishing what is held")
            self.service.stopping.set()

    def healthy(self) -> bool:
        """Redis answered a recent beat."""
        return time.monotonic() - self.last_ok_s < 3 * self.interval_s + 1

    def reap(self) -> None:
        s = self.service
        reaped = reap_once(self.redis, self.scripts, s.settings, s.tag, s.worker_id)
        if reaped is not None and (reaped.requeued or reaped.dead or reaped.ended):
            log.info(
                "reaper: %d requeued, %d dead-lettered, %d ended (expired or cancelled)",
                reaped.requeued,
                reaped.dead,
                reaped.ended,
            )

    def _apply(self, ids: list[str], codes: list[int], cancels: list[Any]) -> None:
        for request_id, code, cancel in zip(ids, codes, cancels, strict=True):
            if code == LEASE_LOST and self.service.ending(request_id):
                continue  # its finish went out meanwhile; the finish's reply settles it
            if code == LEASE_LOST:
                log.warning("lease on %s expired; it resumes elsewhere", request_id)
                self.service.lost.put(request_id)
            elif cancel == b"1":
                self.service.cancelled.put(request_id)

    def _register(self, pipe: Any) -> None:
        s = self.service
        register_worker(pipe, s.keys, s.settings, s.worker_id, {**self.info, **self._figures()})

    def _figures(self) -> dict[str, Any]:
        stats = self.service.engine.stats()
        self.service.metrics.on_engine_stats(stats)
        now, tokens = time.monotonic(), self.service.num_generated_tokens
        rate = (tokens - self._last_tokens) / max(now - self._last_time, 1e-6)
        self._last_tokens, self._last_time = tokens, now
        return {
            "running": len(self.service.held),
            "tokens_per_s": round(rate, 1),
            "kv_cache_usage": round(stats.get("kv_cache_usage", 0.0), 3),
            "prefix_cache_hit_rate": round(
                stats.get("prefix_cache_hits", 0) / max(stats.get("prefix_cache_queries", 0), 1), 3
            ),
            "state": "draining" if self.service.stopping.is_set() else "serving",
            "coalesce_p99_ms": round(self.service.coalescer.p99_delay_ms(), 1),
            "loras": ",".join(self.service.engine.resident_loras()),
        }

    def deregister(self) -> None:
        s = self.service
        try:
            self.redis.delete(s.keys.worker(s.worker_id))
            self.redis.zrem(s.keys.workers(), s.worker_id)
        except redis.RedisError:
            pass  # the registry entry expires on its own


class LoadingBeat(threading.Thread):
    """While the model loads: the worker is in the registry (state ``loading``) and its
    model counts as served, so requests submitted meanwhile queue instead of being
    refused, and dashboards show the worker coming up."""

    def __init__(
        self, connection: redis.Redis, settings: Settings, worker_id: str, info: dict[str, Any]
    ) -> None:
        super().__init__(name="tokenq-loading-beat", daemon=True)
        self.redis = connection
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.worker_id = worker_id
        self.info = {**info, "state": "loading"}
        self.done = threading.Event()

    def beat(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        register_worker(pipe, self.keys, self.settings, self.worker_id, self.info)
        pipe.execute()

    def run(self) -> None:
        while not self.done.wait(self.settings.worker_heartbeat_ms / 1000):
            try:
                self.beat()
            except redis.RedisError as e:
                log.warning("registry beat while loading failed (%s); retrying", e)

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=5)
