"""Reference outputs from transformers' own ``generate``, one request at a time,
kept in a disk cache so that a second test run does not compute them again.

A cache entry's key is a digest of everything that changes the reference: the
model's files (path, size and modification time of each), the inputs and settings,
the transformers and torch versions, and the source of the module that computes it.
Anything else, or a missing or unreadable entry, computes afresh. Entries live in
the repository's gitignored ``.cache/references/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

CACHE_DIR = Path(__file__).resolve().parents[1] / ".cache" / "references"
T = TypeVar("T")


@cache
def _load(model_dir: Path) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    model.eval()
    return model, tokenizer


def greedy_reference(
    model_dir: Path, prompts: list[tuple[str, bool]], max_tokens: int
) -> list[list[int]]:
    """Greedy completion token ids for each (text, is_chat) prompt, generated alone."""
    return cached_json(
        model_dir,
        {"prompts": prompts, "max_tokens": max_tokens},
        __name__,
        lambda: _greedy_reference(model_dir, prompts, max_tokens),
        lambda value: value,
        lambda data: [[int(t) for t in row] for row in data],
    )


def _greedy_reference(
    model_dir: Path, prompts: list[tuple[str, bool]], max_tokens: int
) -> list[list[int]]:
    import torch

    model, tokenizer = _load(model_dir)
    outputs = []
    for text, chat in prompts:
        ids = _encode(tokenizer, text, chat)
        with torch.inference_mode():
            out = model.generate(  # type: ignore[attr-defined]
                torch.tensor([ids]),
                max_new_tokens=max_tokens,
                do_sample=False,
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            )
        outputs.append(_trim_eos(out[0, len(ids) :].tolist(), tokenizer))
    return outputs


def _encode(tokenizer: object, text: str, chat: bool) -> list[int]:
    if chat:
        messages = [{"role": "user", "content": text}]
        encoded = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(encoded["input_ids"])
    return list(tokenizer(text)["input_ids"])  # type: ignore[operator]


def _trim_eos(ids: list[int], tokenizer: object) -> list[int]:
    eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def cached_json(
    model_dir: str | Path,
    inputs: Any,
    computed_by: str,
    compute: Callable[[], T],
    encode: Callable[[T], Any],
    decode: Callable[[Any], T],
) -> T:
    """``compute()`` once per key; later calls with the same key read it back.

    ``computed_by`` names the module that computes it, whose source is in the key.
    """
    path = CACHE_DIR / f"{cache_key(model_dir, inputs, computed_by)}.json"
    try:
        return decode(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(encode(value)))
    tmp.replace(path)  # atomic: a concurrent run reads the old entry or the whole new one
    return value


def cache_key(model_dir: str | Path, inputs: Any, computed_by: str) -> str:
    import torch
    import transformers

    source = Path(sys.modules[computed_by].__file__ or "").read_bytes()
    parts = {
        "model": _model_identity(Path(model_dir)),
        "inputs": inputs,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "source": hashlib.sha256(source).hexdigest(),
    }
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _model_identity(model_dir: Path) -> list[tuple[str, int, int]]:
    if model_dir.is_file():
        files = [model_dir]
    else:
        files = sorted(p for p in model_dir.rglob("*") if p.is_file())
    identity = []
    for path in files:
        stat = path.stat()
        identity.append((str(path.resolve()), stat.st_size, stat.st_mtime_ns))
    return identity


def embedding_reference(model_dir: Path, texts: list[str]) -> list[list[float]]:
    """Each text's mean-pooled, L2-normalised last hidden state, from transformers alone."""
    return cached_json(
        model_dir,
        {"texts": texts, "pooling": "mean"},
        __name__,
        lambda: _embedding_reference(model_dir, texts),
        lambda value: value,
        lambda data: [[float(v) for v in row] for row in data],
    )


def _embedding_reference(model_dir: Path, texts: list[str]) -> list[list[float]]:
    import torch

    model, tokenizer = _load(model_dir)
    vectors = []
    for text in texts:
        ids = torch.tensor([_encode(tokenizer, text, False)])
        with torch.inference_mode():
            hidden = model.model(input_ids=ids).last_hidden_state[0]  # type: ignore[attr-defined]
        mean = hidden.mean(dim=0)
        vectors.append((mean / mean.norm()).tolist())
    return vectors
