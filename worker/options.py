"""The worker's own options (the engine's are ``EngineConfig``'s): each declared once,
with its default and help, and offered by `tokenq worker` (``worker.flags``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerOptions:
    model: str | None = field(
        default=None,
        metadata={"help": "name, local path, or sim:... (default TOKENQ_DEFAULT_MODEL)"},
    )
    served_model_name: str | None = field(default=None, metadata={"help": "name clients use"})
    burst: bool = field(default=False, metadata={"help": "exit once the queue is empty"})
    engine_process: bool = field(
        default=False,
        metadata={
            "help": "run the engine in a child process of its own, beside the worker's Redis "
            "side and tokenizer (default: off, one process)"
        },
    )
    engine: str = field(
        default="builtin",
        metadata={
            "help": "builtin (tokenq's own) or vllm (vLLM's engine: tokenq's vllm extra, or "
            "`make vllm-setup` on CPUs); the options whose help starts with vLLM: are its"
        },
    )
    speculative_config: str | None = field(
        default=None,
        metadata={
            "help": "speculative decoding, vLLM's JSON (either engine): "
            '\'{"method": "ngram", "num_speculative_tokens": 4}\' or \'{"model": PATH}\' '
            "(a draft model sharing the tokenizer); default: off"
        },
    )
