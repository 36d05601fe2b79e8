"""What a tokenizer's chat template does with tools and reasoning, read from the
template's text and the tokenizer's vocabulary (``shared.chat.ChatFeatures``), for the
worker to register: the producer side, which has no tokenizer, renders requests and
reads answers by it."""

from __future__ import annotations

import logging
import re
from typing import Any

from shared.chat import ChatFeatures, ToolFormat

log = logging.getLogger(__name__)
THINK_TAGS = ("<think>", "</think>")
_USES_TOOLS = re.compile(r"\btools\b")
_PROBE = "tokenq-probe"


def chat_features(tokenizer: Any) -> ChatFeatures:
    """The features of ``tokenizer``'s chat template (a plain template when it has none)."""
    template = template_text(tokenizer)
    if not template:
        return ChatFeatures()
    vocab = _vocab(tokenizer)
    think = THINK_TAGS if _has_think_tags(template, vocab) else None
    return ChatFeatures(
        tool_format=tool_format(template),
        think=think,
        think_open=think is not None and _opens_thinking(tokenizer, think),
    )


def template_text(tokenizer: Any) -> str:
    """The template's source; a tokenizer with several named ones has them all read."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return template if isinstance(template, str) else ""


def tool_format(template: str) -> ToolFormat | None:
    """The format a template that renders ``tools`` teaches its model to call them in;
    None for a template that ignores tools, or whose format tokenq cannot read (the
    fallback prompt serves those)."""
    if not _USES_TOOLS.search(template):
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        # Mistral's later templates write name[ARGS]{...} with special tokens that text
        # deltas leave out; only the JSON array form can be read back.
        return None if "[ARGS]" in template else "mistral"
    if '"parameters"' in template and ("<|python_tag|>" in template or "ipython" in template):
        return "llama3_json"
    return None


def _has_think_tags(template: str, vocab: set[str]) -> bool:
    return all(tag in template or tag in vocab for tag in THINK_TAGS)


def _vocab(tokenizer: Any) -> set[str]:
    try:
        return set(tokenizer.get_vocab())
    except (AttributeError, NotImplementedError):
        return set()


def _opens_thinking(tokenizer: Any, think: tuple[str, str]) -> bool:
    """Whether the generation prompt opens a think block itself (the reply then starts
    inside it, as DeepSeek-R1's and Qwen3 thinking models' do)."""
    try:
        text: Any = tokenizer.apply_chat_template(
            [{"role": "user", "content": _PROBE}], add_generation_prompt=True, tokenize=False
        )
    except Exception as e:  # a template that needs more than one user turn
        log.warning("could not render the chat template to probe it: %s", e)
        return False
    tail = str(text)[str(text).rfind(_PROBE) + len(_PROBE) :]
    start, end = think
    return tail.rfind(start) > tail.rfind(end)
