"""Start a worker: load the engine, serve a model's queue, drain on SIGTERM."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from shared import tracing
from shared.chat import REGISTRY_FIELD as CHAT_FIELD
from shared.connection import UNREACHABLE, connect, wait_for_redis
from shared.gc_policy import freeze_startup_objects
from shared.registry import GUIDED_FIELD, LIMITS_FIELD, withdraw_failed_worker
from shared.settings import Settings
from shared.version import VERSION
from worker.chat_template import chat_features
from worker.engine.config import EngineConfig
from worker.engine.errors import ModelLoadError
from worker.engine.speculative.config import SpeculativeConfig
from worker.engine_process import EngineProcess
from worker.heartbeat import Heartbeat, LoadingBeat
from worker.lease_keeper import LeaseKeeper
from worker.metrics import WorkerMetrics, serve_http
from worker.model_store import resolve_model
from worker.queue import ModelQueue
from worker.service import WorkerService
from worker.sim import SimConfig, SimEngine, is_sim

if TYPE_CHECKING:
    from worker.engine import Engine

log = logging.getLogger("tokenq.worker")
# How long a worker about to serve waits for its lease keeper to be up (it started as the
# model began to load, so this is rarely waited for).
KEEPER_START_S = 30.0


@dataclass(frozen=True)
class WorkerOptions:
    model: str
    served_model_name: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int | None = None
    kv_cache_mib: int | None = None
    pooling: str = "mean"
    max_loras: int = 4
    max_lora_rank: int = 16
    burst: bool = False
    enforce_eager: bool = False
    max_model_len: int | None = None
    self_check: bool = True
    trust_remote_code: bool = False
    async_scheduling: bool | None = None  # None: the device's default
    timed_forward_ms: float | None = None
    grammar_compile_threads: int = 4
    grammar_compile_timeout_s: float = 10.0
    engine_process: bool = False  # the engine in a child process (worker/engine_process.py)
    quantization: str | None = None
    speculative_config: str | None = field(
        default=None,
        metadata={
            "help": "speculative decoding in the built-in engine, as vLLM's JSON: "
            '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
            '"prompt_lookup_min": 2, "disable_by_batch_size": 4}\' (n-gram prompt lookup; or '
            "'{\"model\": PATH}' for a draft model sharing the tokenizer), verified in one "
            "forward; greedy output unchanged; steps run synchronously; "
            "default: off"
        },
    )


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def engine_config(opts: WorkerOptions) -> EngineConfig | SimConfig:
    """The engine's settings, built once and validated before anything is announced
    (a model name, not yet its resolved path: that may mean a download or a conversion)."""
    if is_sim(opts.model):
        sim = SimConfig.parse(opts.model)
        return replace(sim, max_loras=opts.max_loras, max_lora_rank=opts.max_lora_rank)
    config = EngineConfig(
        model=opts.model,
        device=opts.device,
        dtype=opts.dtype,
        kv_cache_mib=opts.kv_cache_mib,
        pooling=opts.pooling,
        enforce_eager=opts.enforce_eager,
        max_loras=opts.max_loras,
        max_lora_rank=opts.max_lora_rank,
        max_model_len=opts.max_model_len,
        self_check=opts.self_check,
        trust_remote_code=opts.trust_remote_code,
        async_scheduling=opts.async_scheduling,
        timed_forward_ms=opts.timed_forward_ms,
        grammar_compile_threads=opts.grammar_compile_threads,
        grammar_compile_timeout_s=opts.grammar_compile_timeout_s,
        quantization=opts.quantization,
        speculative_config=(
            None
            if opts.speculative_config is None
            else SpeculativeConfig.from_json(opts.speculative_config)
        ),
    )
    if opts.max_num_seqs is not None:
        config = replace(config, max_num_seqs=opts.max_num_seqs)  # validated again
    return config


def build_engine(
    config: EngineConfig | SimConfig, engine_process: bool = False
) -> Engine | SimEngine | EngineProcess:
    """The engine; with ``engine_process``, a real one runs in a child process."""
    if isinstance(config, SimConfig):
        return SimEngine(config)
    if engine_process:
        return EngineProcess(config)
    from worker.engine import Engine  # torch loads here, not for sim workers

    return Engine(replace(config, model=str(resolve_model(config.model))))


def run_worker(settings: Settings, opts: WorkerOptions, config: EngineConfig | SimConfig) -> None:
    """Serve until SIGTERM/SIGINT (or, with ``burst``, until the queue is empty), with
    the engine ``config`` that ``engine_config(opts)`` built."""
    started = time.monotonic()
    tracing.set_service_name("tokenq-worker")
    model_name = opts.served_model_name or opts.model
    connection = connect(settings.redis_url, settings.redis_cluster, health_check_interval=30)
    wait_for_redis(connection, settings.redis_url, log)
    worker_id = new_worker_id()
    queue = ModelQueue(connection, settings, model_name, worker_id)
    guided = serves_structured_outputs(config)
    loading = LoadingBeat(queue, {**_info(model_name, opts), GUIDED_FIELD: int(guided)})
    loading.beat()  # the model counts as served from here on: requests queue meanwhile
    loading.start()
    metrics, readiness = WorkerMetrics(model_name), Readiness()
    if settings.worker_metrics_port is not None:
        serve_http(settings.worker_metrics_port, metrics, readiness)
    keeper = start_keeper(settings, queue)  # started here, so that it loads as the model does
    engine = None
    try:
        engine = _load(config, opts.engine_process, loading, connection, settings, model_name)
        service = WorkerService(
            engine, connection, settings, model_name, worker_id, metrics, guided
        )
        heartbeat = start_heartbeat(service, engine, keeper)
        readiness.check = lambda: heartbeat.healthy() and not service.stopping.is_set()
        _install_signal_handlers(service)
        freeze_startup_objects()
        ready_s = time.monotonic() - started
        log.info("worker %s serving %r (ready in %.1fs)", worker_id, model_name, ready_s)
        try:
            service.run(burst=opts.burst)
            service.drain(settings.drain_timeout_s)
        finally:
            heartbeat.stop()
            service.close()
    finally:
        if isinstance(engine, EngineProcess):
            engine.close()  # whatever ended the worker: no engine process left behind
        if keeper is not None:
            keeper.stop()
    log.info("worker %s stopped", worker_id)


def _load(
    config: EngineConfig | SimConfig,
    engine_process: bool,
    loading: LoadingBeat,
    connection: Any,
    settings: Settings,
    model_name: str,
) -> Engine | SimEngine | EngineProcess:
    """The engine; if the model cannot be loaded, the worker takes back what it registered
    and leaves the reason for submits to read (``withdraw_failed_worker``), then raises."""
    try:
        return build_engine(config, engine_process)
    except Exception as e:
        loading.stop()
        reason = str(e) if isinstance(e, ModelLoadError) else f"{type(e).__name__}: {e}"
        with contextlib.suppress(*UNREACHABLE):
            q = loading.queue
            withdraw_failed_worker(connection, q.keys, settings, q.worker_id, model_name, reason)
        raise
    finally:
        loading.stop()


class Readiness:
    """Not ready while the model loads; then whatever ``check`` says."""

    def __init__(self) -> None:
        self.check: Callable[[], bool] = lambda: False

    def __call__(self) -> bool:
        return self.check()


def _info(model_name: str, opts: WorkerOptions) -> dict[str, Any]:
    return {"model": model_name, "version": VERSION, "pid": os.getpid(), "device": opts.device}


def serves_structured_outputs(config: EngineConfig | SimConfig) -> bool:
    """Whether this worker's grammar backend works; says so in one line when not (the
    worker then registers that, and claims no structured request)."""
    if isinstance(config, SimConfig):
        return True  # a simulated model takes any request and ignores its grammar
    from worker.engine.grammar import grammar_backend_problem

    problem = grammar_backend_problem()
    if problem is not None:
        log.warning("structured outputs off on this worker: %s", problem)
    return problem is None


def start_keeper(settings: Settings, queue: ModelQueue) -> LeaseKeeper | None:
    """The child process that keeps the worker's leases while a step holds the GIL
    (worker/lease_keeper.py says why a process); none with the stall limit off."""
    if not settings.worker_stall_limit_ms:
        return None
    return LeaseKeeper.start(settings, queue.tag, queue.worker_id)


def start_heartbeat(
    service: WorkerService,
    engine: Engine | SimEngine | EngineProcess,
    keeper: LeaseKeeper | None = None,
) -> Heartbeat:
    info = {
        "model": service.model,
        "version": VERSION,
        "pid": os.getpid(),
        "device": str(engine.device),
        "max_num_seqs": engine.config.max_num_seqs,
        "kv_cache_mib": engine.kv_cache_budget_bytes // 2**20,
        "max_loras": getattr(engine.config, "max_loras", 0),
        "max_lora_rank": engine.lora_rank_limit(),  # 0: it claims no adapter requests
    }
    if engine.embedding_size is not None:  # the gateway refuses larger ``dimensions``
        info["embedding_size"] = engine.embedding_size
    info[GUIDED_FIELD] = int(service.guided)
    if not isinstance(engine, SimEngine):  # what a submit checks up front (shared.limits)
        info[LIMITS_FIELD] = engine.limits(service.guided).model_dump_json()
    tokenizer = getattr(engine, "tokenizer", None)  # a simulated model has none
    if tokenizer is not None:  # tools through the template, and reasoning, are read by it
        info[CHAT_FIELD] = chat_features(tokenizer).to_field()
    s = service.settings
    queue = service.queue.sibling(connect(s.redis_url, s.redis_cluster))
    if keeper is not None:  # before the worker serves: a first step may hold the GIL
        keeper.wait_ready(KEEPER_START_S)
    heartbeat = Heartbeat(queue, service, info, keeper)
    heartbeat.beat()
    heartbeat.start()
    return heartbeat


def _install_signal_handlers(service: WorkerService) -> None:
    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: no more claims; draining", signal.Signals(signum).name)
        service.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
