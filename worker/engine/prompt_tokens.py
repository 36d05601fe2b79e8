"""A prompt as tokens, through a tokenizer and its chat template: the engine's, or the
worker's copy of it when the engine runs in a process of its own (light to import:
no torch)."""

from __future__ import annotations

from typing import Any

import jinja2

from shared.refusal import invalid


def encode_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """The chat prompt's tokens: ``messages`` (OpenAI's shape) and ``tools`` (OpenAI
    function tools) through the chat template, with ``template_kwargs`` as its extra
    variables (``enable_thinking``...)."""
    template_tools: Any = tools
    try:
        text: Any = tokenizer.apply_chat_template(
            messages,
            tools=template_tools,
            add_generation_prompt=True,
            tokenize=False,
            **(template_kwargs or {}),
        )
    except jinja2.TemplateError as e:  # the template's own refusal: the request's fault
        raise invalid("messages", f"the model's chat template refused these messages: {e}") from e
    # What tokenize=True gives (the rendered text, no special tokens added), cheaper.
    return encode_text(tokenizer, str(text), add_special_tokens=False)


def encode_text(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    """``tokenizer(text)``'s ids, through its Rust tokenizer where it has one: the same
    ids for about half the cost of transformers' wrapper, which the worker's loop pays
    for every request it admits."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    ids: list[int] = backend.encode(text, add_special_tokens=add_special_tokens).ids
    return ids


class TokenizerPrompts:
    """``encode_prompt`` and ``encode_chat`` through ``self.tokenizer``: the engine's,
    and the worker's copy when the engine runs in a process of its own."""

    tokenizer: Any

    def encode_prompt(self, prompt: str) -> list[int]:
        return encode_text(self.tokenizer, prompt, add_special_tokens=True)

    def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        return encode_text(self.tokenizer, text, add_special_tokens)

    def decode_tokens(self, token_ids: list[int]) -> str:
        """The ids as text, special tokens included (as vLLM's /detokenize reads them)."""
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """The chat prompt's tokens (``encode_chat``, above)."""
        return encode_chat(self.tokenizer, messages, tools, template_kwargs)


def max_bytes_per_token(tokenizer: Any) -> int:
    """The most UTF-8 bytes, whitespace aside, one token of ``tokenizer`` spells: no
    text of n such bytes is fewer than n / this tokens (``shared.limits``)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    spelled = (tokenizer.convert_tokens_to_string([t]) for t in tokens if t)
    return max(1, *(len("".join(text.split()).encode()) for text in spelled))
