"""The vLLM engine's configuration, checked at start-up before anything is announced."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.vllm_engine.options import (
    INSTALL_CPU,
    INSTALL_GPU,
    VllmOptionError,
    VllmOptions,
    check_known,
    engine_arg_values,
)

# What tokenq asks of vLLM unless told otherwise: its priority scheduler (tokenq's
# priorities), and its figures each step (the registry's and num_free_slots').
DEFAULT_ENGINE_ARGS: dict[str, Any] = {"scheduling_policy": "priority", "disable_log_stats": False}


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
    def max_loras(self) -> int:
        return 0


def vllm_engine_config(
    model: str, opts: VllmOptions, shared: Mapping[str, Any]
) -> VllmEngineConfig:
    """The engine arguments asked for (``options.engine_arg_values``) over tokenq's
    defaults; VllmOptionError naming any key ``EngineArgs`` lacks, VllmMissing when
    vLLM is not installed."""
    values = {**DEFAULT_ENGINE_ARGS, **engine_arg_values(opts, shared)}
    check_known(values, engine_arg_names())
    if "model" in values:
        raise VllmOptionError("give the model as --model, not as an engine argument")
    return VllmEngineConfig(model=model, engine_args=values)


def engine_arg_names() -> list[str]:
    """The names ``vllm.EngineArgs`` takes (its dataclass fields)."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmMissing(
            f"--engine vllm: vLLM is not installed here; add it with {INSTALL_GPU} on a "
            f"GPU machine, or {INSTALL_CPU} on a CPU one"
        )
    from vllm.engine.arg_utils import EngineArgs

    return [f.name for f in dataclasses.fields(EngineArgs)]
