"""Starting vLLM's engine from a tokenq worker's configuration, and what tokenq reads
of the model beside it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from transformers import GenerationConfig
from vllm import EngineArgs
from vllm.config import PoolerConfig, StructuredOutputsConfig
from vllm.v1.engine.llm_engine import LLMEngine

from worker.engine.errors import ModelLoadError
from worker.engine.runner_support import eos_token_ids
from worker.vllm_engine.config import VllmEngineConfig
from worker.vllm_engine.figures import Figures

# The engine arguments that EngineArgs takes only as vLLM's config objects.
NESTED: dict[str, Any] = {
    "structured_outputs_config": StructuredOutputsConfig,
    "pooler_config": PoolerConfig,
}


def start_engine(config: VllmEngineConfig, figures: Figures) -> Any:
    """vLLM's engine; ModelLoadError (one line: what vLLM said) when it will not start."""
    try:
        args = EngineArgs(model=config.model, **engine_args(config))
        return LLMEngine.from_engine_args(args, stat_loggers=[figures.factory])
    except (ValueError, TypeError, RuntimeError) as e:  # its config checks, a bad value
        said = " ".join(str(e).split())
        raise ModelLoadError(f"vLLM could not start {config.model}: {said}") from e


def engine_args(config: VllmEngineConfig) -> dict[str, Any]:
    """The engine arguments, a nested config given as a mapping as vLLM's own (EngineArgs
    converts most of them itself, but not these)."""
    args = dict(config.engine_args)
    for name, nested in NESTED.items():
        if isinstance(args.get(name), dict):
            args[name] = nested(**args[name])
    return args


def eos_token_ids_of(model: str, tokenizer: Any) -> tuple[int, ...]:
    """The ids that end a request, as the built-in engine reads them (and vLLM does):
    the generation config's, else the tokenizer's."""
    try:
        generation_config = GenerationConfig.from_pretrained(model)
    except OSError:  # none: the tokenizer's
        generation_config = None
    return eos_token_ids(SimpleNamespace(generation_config=generation_config), tokenizer)
