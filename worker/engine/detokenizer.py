"""Token ids to text, one step at a time, and stop strings over that text."""

from __future__ import annotations

from typing import Any, Protocol

# Prompt tokens decoded ahead of the first output token, so that tokenizers which
# drop a leading space at the start of a decode still give it to the first token.
NUM_CONTEXT_TOKENS = 6


class Tokenizer(Protocol):
    def decode(
        self, token_ids: list[int], skip_special_tokens: bool = ..., **kwargs: Any
    ) -> str | list[str]: ...


class IncrementalDetokenizer:
    """Text deltas from a growing list of token ids.

    Each step decodes a short window behind the new tokens and emits what lies past
    the window's previously read part, holding back text that ends in an
    incomplete multi-byte character (U+FFFD) until more tokens complete it.
    """

    def __init__(self, tokenizer: Tokenizer, context_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self._backend = _plain_backend(tokenizer)
        self.token_ids = list(context_ids[-NUM_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)

    def add(self, token_ids: list[int]) -> str:
        self.token_ids.extend(token_ids)
        prefix_text = self._decode(self.prefix_offset, self.read_offset)
        full_text = self._decode(self.prefix_offset, len(self.token_ids))
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        return full_text[len(prefix_text) :]

    def _decode(self, start: int, end: int) -> str:
        if self._backend is not None:
            backend_text: str = self._backend.decode(
                self.token_ids[start:end], skip_special_tokens=True
            )
            return backend_text
        text = self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=True)
        return text if isinstance(text, str) else "".join(text)


def _plain_backend(tokenizer: Tokenizer) -> Any:
    """The fast tokenizer's own (Rust) tokenizer, where transformers' ``decode`` adds
    nothing to it (no clean-up of spaces): the same text for a tenth of the Python
    cost, which counts at a few hundred tokens a step."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return backend


class StopStringMatcher:
    """Finds stop strings in the text so far and decides how much text is safe to emit.

    Text that could still become the start of a stop string is held back until
    the next tokens decide it.
    """

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = stop
        self.max_stop_len = max((len(s) for s in stop), default=0)
        self.text = ""
        self.num_emitted_chars = 0

    def add(self, delta: str, can_stop: bool = True) -> tuple[str, bool]:
        """Append ``delta``; return the text now safe to emit and whether a stop
        string matched (the emitted text then ends right before it). With
        ``can_stop`` false (``min_tokens`` not reached yet) matches are ignored."""
        search_from = max(0, len(self.text) - self.max_stop_len + 1)
        self.text += delta
        cut = self._find_stop(search_from) if can_stop else None
        if cut is not None:
            return self._emit_until(cut), True
        return self._emit_until(len(self.text) - self._num_held_back()), False

    def flush(self) -> str:
        return self._emit_until(len(self.text))

    def _find_stop(self, search_from: int) -> int | None:
        hits = [i for s in self.stop if (i := self.text.find(s, search_from)) >= 0]
        return min(hits) if hits else None

    def _num_held_back(self) -> int:
        held = 0
        for stop in self.stop:
            for k in range(min(len(stop) - 1, len(self.text)), held, -1):
                if self.text.endswith(stop[:k]):
                    held = k
                    break
        return held

    def _emit_until(self, end: int) -> str:
        end = max(end, self.num_emitted_chars)
        piece = self.text[self.num_emitted_chars : end]
        self.num_emitted_chars = end
        return piece
