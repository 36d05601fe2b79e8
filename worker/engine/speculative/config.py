"""The operator's ``--speculative-config``: vLLM's JSON shape, checked once at start-up.

``{"model": PATH, "num_speculative_tokens": 4}`` (method ``draft_model``) proposes with
a small model that shares the target's tokenizer, greedily, one forward a token;
``"quantization": "w8a8"`` (or ``"int8"``) quantizes that draft's weights at load, so the
target itself, quantized, can be its own faster draft. (vLLM's key of that name names
the method a draft checkpoint was quantized with; ``worker.main`` refuses these two there.)

``{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
"prompt_lookup_min": 2}`` proposes, for each sequence, up to ``num_speculative_tokens``
tokens that followed the latest earlier occurrence of its last ``prompt_lookup_max``
(down to ``prompt_lookup_min``) tokens in its own prompt and output. Speculation stays
off for a step of more than ``disable_by_batch_size`` sequences, where the batch already
keeps the device busy (vLLM's key of the same name; ``bench/speculative.py
--streams`` measures where it stops paying).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import orjson

METHODS = ("ngram", "draft_model")

# Above this many sampling rows in a step, no row is drafted: a large batch's step is
# no longer bound by reading the weights, and verifying drafts gains less. The largest
# batch where speculation was measured to pay on a CPU with torch's default threads
# (on one thread it paid up to 64, the CPU's default max_num_seqs); on a GPU it is not
# measured (bench/speculative.py --streams; docs/how-to/speculative-decoding.md).
DEFAULT_DISABLE_BY_BATCH_SIZE = 32


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE
    # method "draft_model": the draft model's name or path (its tokenizer the target's),
    # and how its weights are quantized at load (``EngineConfig.quantization``'s methods).
    model: str | None = None
    quantization: str | None = None

    def __post_init__(self) -> None:
        if (self.method == "draft_model") != (self.model is not None):
            raise ValueError(
                "speculative_config: a draft model is named by model, with method "
                f"draft_model (got method {self.method!r}, model {self.model!r})"
            )
        if self.quantization is not None and self.model is None:
            raise ValueError(
                "speculative_config: quantization applies to a draft model: name one by "
                f"model (got quantization {self.quantization!r} with method {self.method!r})"
            )
        if self.method not in METHODS:
            raise ValueError(
                f"speculative_config: method {self.method!r} is not served by the built-in "
                f"engine; use one of {', '.join(METHODS)}"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"speculative_config: {name} must be an integer >= 1, got {value!r}"
                )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative_config: prompt_lookup_min {self.prompt_lookup_min} is above "
                f"prompt_lookup_max {self.prompt_lookup_max}"
            )
        value = self.disable_by_batch_size
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(
                f"speculative_config: disable_by_batch_size must be an integer >= 1, got {value!r}"
            )

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        """Parsed from ``--speculative-config``'s JSON; a key it does not know is refused
        by name rather than ignored."""
        try:
            raw: Any = orjson.loads(text)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"speculative_config: not valid JSON ({e}): {text!r}") from e
        if not isinstance(raw, dict):
            raise ValueError(f"speculative_config: must be a JSON object, got {text!r}")
        if "model" in raw and "method" not in raw:  # as vLLM infers it
            raw["method"] = "draft_model"
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown key(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        return cls(**raw)
