"""Tokenizers with real models' chat templates (tests/worker/chat_templates): the default
model's tokenizer with the template set and the template's own tokens added, as a
model of that family would have them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "chat_templates"
QWEN3_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
MISTRAL_TOKENS = ("[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[INST]", "[/INST]")


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def templated_tokenizer(
    source: str, chat_template: str, tokens: tuple[str, ...] = (), special: tuple[str, ...] = ()
) -> Any:
    """The tokenizer at ``source`` with ``chat_template``, ``tokens`` added as plain added
    tokens (as Qwen's <tool_call> is) and ``special`` as special ones (Mistral's)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.chat_template = chat_template
    tokenizer.add_tokens(list(tokens))
    if special:
        tokenizer.add_special_tokens({"additional_special_tokens": list(special)})
    return tokenizer
