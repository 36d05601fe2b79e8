"""Start a worker: load the engine, serve a model's queue, drain on SIGTERM."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING, Any

import orjson

from shared import tracing
from shared.chat import REGISTRY_FIELD as CHAT_FIELD
from shared.connection import UNREACHABLE, connect, wait_for_redis
from shared.gc_policy import freeze_startup_objects
from shared.registry import GUIDED_FIELD, LIMITS_FIELD, withdraw_failed_worker
from shared.settings import Settings
from shared.version import VERSION
from worker.chat_template import chat_features
from worker.engine.config import QUANTIZATION_METHODS, EngineConfig
from worker.engine.errors import ModelLoadError
from worker.engine.speculative.config import SpeculativeConfig
from worker.engine_process import EngineProcess
from worker.flags import Flags
from worker.heartbeat import Heartbeat, LoadingBeat
from worker.lease_keeper import LeaseKeeper
from worker.metrics import WorkerMetrics, serve_http
from worker.model_store import resolve_model
from worker.options import WorkerOptions
from worker.queue import ModelQueue
from worker.service import WorkerService
from worker.sim import SimConfig, SimEngine, is_sim
from worker.vllm_engine.config import VllmEngineConfig, vllm_engine_config
from worker.vllm_engine.options import VllmOptions

if TYPE_CHECKING:
    from worker.engine import Engine
    from worker.vllm_engine.engine import VllmEngine

log = logging.getLogger("tokenq.worker")
# How long a worker about to serve waits for its lease keeper to be up (it started as the
# model began to load, so this is rarely waited for).
KEEPER_START_S = 30.0


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def engine_config(model: str, flags: Flags) -> EngineConfig | SimConfig | VllmEngineConfig:
    """The engine's settings from the worker's options, built once and validated before
    anything is announced (a model name, not yet its resolved path: that may mean a
    download or a conversion). A simulated model takes only the LoRA limits from them;
    ``--engine vllm`` takes ``VllmOptions`` and the engine options vLLM shares."""
    engine = flags.values.get("engine", "builtin")  # flags of EngineConfig alone: built-in
    if engine not in ENGINES:
        raise ValueError(f"--engine {engine!r}: give one of {', '.join(ENGINES)}")
    if engine == "vllm":
        pooling = flags.options_of(EngineConfig)["pooling"]  # the built-in's, for a pooler
        return vllm_engine_config(model, flags.of(VllmOptions), _vllm_shared(flags), pooling)
    if is_sim(model):
        sim = SimConfig.parse(model)
        lora = flags.options_of(EngineConfig)
        return replace(sim, max_loras=lora["max_loras"], max_lora_rank=lora["max_lora_rank"])
    return flags.of(EngineConfig, model=model, speculative_config=_speculative(flags))


ENGINES = ("builtin", "vllm")
# The built-in engine's options that vLLM takes under the same names.
VLLM_SHARED = (
    "dtype",
    "max_num_seqs",
    "max_model_len",
    "enforce_eager",
    "quantization",
    "trust_remote_code",
    "max_loras",  # with --enable-lora
    "max_lora_rank",
)


def _vllm_shared(flags: Flags) -> dict[str, Any]:
    """Those of ``VLLM_SHARED`` given (not at their defaults), and the speculative
    config (vLLM reads the same JSON)."""
    given = flags.options_of(EngineConfig)
    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    shared = {k: given[k] for k in VLLM_SHARED if given[k] != defaults[k]}
    text = flags.values.get("speculative_config")
    if text is not None:
        try:
            shared["speculative_config"] = spec = orjson.loads(text)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"--speculative-config: not valid JSON ({e}): {text!r}") from e
        if isinstance(spec, dict) and spec.get("quantization") in QUANTIZATION_METHODS:
            raise ValueError(
                f"--speculative-config: quantization {spec['quantization']!r} quantizes a draft "
                "at load in the built-in engine only; vLLM's key names the method a draft "
                "checkpoint was quantized with"
            )
    return shared


def _speculative(flags: Flags) -> SpeculativeConfig | None:
    """The built-in engine's speculative decoding, from ``--speculative-config``."""
    text = flags.values.get("speculative_config")
    return None if text is None else SpeculativeConfig.from_json(text)


def build_engine(
    config: EngineConfig | SimConfig | VllmEngineConfig, engine_process: bool = False
) -> Engine | SimEngine | EngineProcess | VllmEngine:
    """The engine; with ``engine_process``, a real one runs in a child process."""
    if isinstance(config, SimConfig):
        return SimEngine(config)
    if isinstance(config, VllmEngineConfig):
        from worker.vllm_engine.engine import VllmEngine  # vLLM loads here, only when asked

        return VllmEngine(replace(config, model=str(resolve_model(config.model))))
    if engine_process:
        return EngineProcess(config)
    from worker.engine import Engine  # torch loads here, not for sim workers

    return Engine(replace(config, model=str(resolve_model(config.model))))


def run_worker(
    settings: Settings, opts: WorkerOptions, config: EngineConfig | SimConfig | VllmEngineConfig
) -> None:
    """Serve until SIGTERM/SIGINT (or, with ``burst``, until the queue is empty), with
    the engine ``config`` that ``engine_config`` built."""
    started = time.monotonic()
    tracing.set_service_name("tokenq-worker")
    model_name = opts.served_model_name or opts.model or settings.default_model
    connection = connect(settings.redis_url, settings.redis_cluster, health_check_interval=30)
    wait_for_redis(connection, settings.redis_url, log)
    worker_id = new_worker_id()
    queue = ModelQueue(connection, settings, model_name, worker_id)
    guided = serves_structured_outputs(config)
    loading = LoadingBeat(queue, {**_info(model_name, config), GUIDED_FIELD: int(guided)})
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
    config: EngineConfig | SimConfig | VllmEngineConfig,
    engine_process: bool,
    loading: LoadingBeat,
    connection: Any,
    settings: Settings,
    model_name: str,
) -> Engine | SimEngine | EngineProcess | VllmEngine:
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


def _info(model_name: str, config: EngineConfig | SimConfig | VllmEngineConfig) -> dict[str, Any]:
    device = config.device if isinstance(config, EngineConfig) else SimEngine.device
    if isinstance(config, VllmEngineConfig):
        device = "vllm"  # vLLM picks it; the heartbeat says which once it has started
    return {"model": model_name, "version": VERSION, "pid": os.getpid(), "device": device}


def serves_structured_outputs(config: EngineConfig | SimConfig | VllmEngineConfig) -> bool:
    """Whether this worker's grammar backend works; says so in one line when not (the
    worker then registers that, and claims no structured request)."""
    if isinstance(config, SimConfig):
        return True  # a simulated model takes any request and ignores its grammar
    if isinstance(config, VllmEngineConfig):
        return True  # vLLM's structured outputs (worker.vllm_engine.mapping), its xgrammar
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
    engine: Engine | SimEngine | EngineProcess | VllmEngine,
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
