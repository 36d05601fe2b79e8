"""The continuous-batching engine: scheduler, KV cache, model runner, sampler, detokenizer.

Usable in process without Redis::

    engine = Engine(EngineConfig(model="SmolLM2-135M-Instruct"))
    engine.add_request(EngineRequest("r1", engine.encode_prompt("Hi"), SamplingParams()))
    while engine.has_unfinished_requests():
        for output in engine.step():
            ...
"""

from worker.engine.config import EngineConfig
from worker.engine.engine import Engine
from worker.engine.outputs import RequestOutput
from worker.engine.request import EngineRequest

__all__ = ["Engine", "EngineConfig", "EngineRequest", "RequestOutput"]
