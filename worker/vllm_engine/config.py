"""The vLLM engine's configuration, checked at start-up before anything is announced."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.engine.config import EngineConfig
from worker.vllm_engine.options import (
    INSTALL_CPU,
    INSTALL_GPU,
    VllmOptionError,
    VllmOptions,
    check_known,
    engine_arg_values,
)

# What tokenq asks of vLLM unless told otherwise: its priority scheduler (tokenq's
# priorities), its figures each step (the registry's and num_free_slots'), and structured
# outputs as the built-in engine makes them: xgrammar (whose limits the producer checks
# schemas against, ``shared.guided``), JSON without free whitespace.
DEFAULT_ENGINE_ARGS: dict[str, Any] = {
    "scheduling_policy": "priority",
    "disable_log_stats": False,
    "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
}
# The built-in engine's --pooling as vLLM's pooler (``PoolerConfig.pooling_type``), for a
# worker asked to pool: both engines embed alike unless told otherwise.
POOLING_TYPES = {"mean": "MEAN", "last": "LAST", "cls": "CLS"}
# With LoRA on, the adapter limits are the built-in engine's flags (their defaults too).
LORA_LIMITS = ("max_loras", "max_lora_rank")


class VllmMissing(RuntimeError):
    """vLLM is not installed where the worker runs."""


@dataclass(frozen=True)
class VllmEngineConfig:
    """What the worker starts vLLM with: the model (a name, resolved when it loads) and
    the engine arguments, checked against ``EngineArgs``."""

    model: str
    engine_args: dict[str, Any]
    max_num_seqs: int = 0  # vLLM's, once it has started (for the registry)

    @property
    def enable_lora(self) -> bool:
        return bool(self.engine_args.get("enable_lora"))

    @property
    def max_loras(self) -> int:
        return int(self.engine_args["max_loras"]) if self.enable_lora else 0


def vllm_engine_config(
    model: str, opts: VllmOptions, shared: Mapping[str, Any], pooling: str = "mean"
) -> VllmEngineConfig:
    """The engine arguments asked for (``options.engine_arg_values``) over tokenq's
    defaults (with ``enable_lora``, the built-in engine's adapter limits; with
    ``runner`` pooling, its ``pooling`` as vLLM's pooler); VllmOptionError naming any
    key ``EngineArgs`` lacks, VllmMissing when vLLM is not installed."""
    asked = engine_arg_values(opts, shared)
    values = {**DEFAULT_ENGINE_ARGS, **(_lora_defaults() if asked.get("enable_lora") else {})}
    if asked.get("runner") == "pooling":
        values["pooler_config"] = _pooler(pooling)
    values.update(asked)
    check_known(values, engine_arg_names())
    if "model" in values:
        raise VllmOptionError("give the model as --model, not as an engine argument")
    return VllmEngineConfig(model=model, engine_args=values)


def _pooler(pooling: str) -> dict[str, Any]:
    if pooling not in POOLING_TYPES:
        raise VllmOptionError(f"--pooling {pooling!r}: use one of {', '.join(POOLING_TYPES)}")
    return {"pooling_type": POOLING_TYPES[pooling]}


def _lora_defaults() -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(EngineConfig) if f.name in LORA_LIMITS}


def engine_arg_names() -> list[str]:
    """The names ``vllm.EngineArgs`` takes (its dataclass fields)."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmMissing(
            f"--engine vllm: vLLM is not installed here; add it with {INSTALL_GPU} on a "
            f"GPU machine, or {INSTALL_CPU} on a CPU one"
        )
    from vllm.engine.arg_utils import EngineArgs

    return [f.name for f in dataclasses.fields(EngineArgs)]
