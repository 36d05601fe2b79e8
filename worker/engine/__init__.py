"""The continuous-batching engine: scheduler, KV cache, model runner, sampler, detokenizer.

Usable in process without Redis::

    engine = Engine(EngineConfig(model="SmolLM2-135M-Instruct"))
    engine.add_request(EngineRequest("r1", engine.encode_prompt("Hi"), SamplingParams()))
    while engine.has_unfinished_requests():
        for output in engine.step():
            ...

``Engine`` (and with it torch) is imported on first use, so that the light modules of
this package (config, request, outputs) load in a moment: a worker announces its model
before it pays for torch and the weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from worker.engine.config import EngineConfig
from worker.engine.outputs import RequestOutput
from worker.engine.request import EngineRequest

if TYPE_CHECKING:
    from worker.engine.engine import Engine

__all__ = ["Engine", "EngineConfig", "EngineRequest", "RequestOutput"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from worker.engine.engine import Engine

        return Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
