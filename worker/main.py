"""Start a worker: load the engine, serve a model's queue, drain on SIGTERM."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

import redis

from shared.gc_policy import freeze_startup_objects
from shared.keys import Keys
from shared.registry import mark_served
from shared.settings import Settings
from worker.heartbeat import Heartbeat
from worker.metrics import WorkerMetrics, serve_http
from worker.model_store import resolve_model
from worker.service import WorkerService
from worker.sim import SimConfig, SimEngine, is_sim

if TYPE_CHECKING:
    from worker.engine import Engine

log = logging.getLogger("tokenq.worker")
VERSION = "0.1.0"


@dataclass(frozen=True)
class WorkerOptions:
    model: str
    served_model_name: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int | None = None
    kv_cache_mib: int | None = None
    burst: bool = False


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def build_engine(opts: WorkerOptions) -> Engine | SimEngine:
    if is_sim(opts.model):
        return SimEngine(SimConfig.parse(opts.model))
    from worker.engine import Engine, EngineConfig  # torch loads here, not for sim workers

    config = EngineConfig(
        model=str(resolve_model(opts.model)),
        device=opts.device,
        dtype=opts.dtype,
        max_num_seqs=EngineConfig.max_num_seqs if opts.max_num_seqs is None else opts.max_num_seqs,
        kv_cache_mib=opts.kv_cache_mib,
    )
    return Engine(config)


def run_worker(settings: Settings, opts: WorkerOptions) -> None:
    """Serve until SIGTERM/SIGINT (or, with ``burst``, until the queue is empty)."""
    started = time.monotonic()
    model_name = opts.served_model_name or opts.model
    connection = redis.Redis.from_url(settings.redis_url, health_check_interval=30)
    announce(connection, settings, model_name)
    metrics, readiness = WorkerMetrics(model_name), Readiness()
    if settings.worker_metrics_port is not None:
        serve_http(settings.worker_metrics_port, metrics, readiness)
    engine = build_engine(opts)
    service = WorkerService(engine, connection, settings, model_name, new_worker_id(), metrics)
    heartbeat = start_heartbeat(service, engine)
    readiness.check = lambda: heartbeat.healthy() and not service.stopping.is_set()
    _install_signal_handlers(service)
    freeze_startup_objects()
    log.info(
        "worker %s serving %r (ready in %.1fs)",
        service.worker_id,
        model_name,
        time.monotonic() - started,
    )
    try:
        service.run(burst=opts.burst)
        service.drain(settings.drain_timeout_s)
    finally:
        heartbeat.stop()
    log.info("worker %s stopped", service.worker_id)


class Readiness:
    """Not ready while the model loads; then whatever ``check`` says."""

    def __init__(self) -> None:
        self.check: Callable[[], bool] = lambda: False

    def __call__(self) -> bool:
        return self.check()


def start_heartbeat(service: WorkerService, engine: Engine | SimEngine) -> Heartbeat:
    info = {
        "model": service.model,
        "version": VERSION,
        "pid": os.getpid(),
        "device": str(engine.device),
        "max_num_seqs": engine.config.max_num_seqs,
        "kv_cache_mib": engine.kv_cache_budget_bytes // 2**20,
    }
    heartbeat = Heartbeat(service, redis.Redis.from_url(service.settings.redis_url), info)
    heartbeat.beat()
    heartbeat.start()
    return heartbeat


def announce(connection: redis.Redis, settings: Settings, model: str) -> None:
    """Say the model is served before loading it, so requests queue meanwhile."""
    pipe = connection.pipeline(transaction=False)
    mark_served(pipe, Keys(settings.namespace), settings, model)
    pipe.execute()


def _install_signal_handlers(service: WorkerService) -> None:
    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: no more claims; draining", signal.Signals(signum).name)
        service.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
