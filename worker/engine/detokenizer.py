"""Token ids to text, one step at a time, and stop strings over that text."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache, partial
from typing import Any, Protocol

from tokenizers import decoders

# Prompt tokens decoded ahead of the first output token, so that tokenizers which
# drop a leading space at the start of a decode still give it to the first token.
NUM_CONTEXT_TOKENS = 6


class Tokenizer(Protocol):
    def decode(
        self, token_ids: list[int], skip_special_tokens: bool = ..., **kwargs: Any
    ) -> str | list[str]: ...


class TokenTexts(dict[int, str]):
    """Each token's text decoded alone, decoded once (at most one entry per id in the
    vocabulary), shared by a tokenizer's detokenizers.

    With ``concatenative`` (a byte-level decoder: a window's text is its tokens' bytes
    decoded together), a window whose tokens' own texts are all whole characters (no
    U+FFFD) decodes to those texts joined: most steps then call no decoder at all.
    """

    def __init__(self, decode: Callable[[list[int]], str], concatenative: bool = False) -> None:
        super().__init__()
        self._decode = decode
        self.concatenative = concatenative

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> TokenTexts:
        return cls(plain_decode(tokenizer), _byte_level(_plain_backend(tokenizer)))

    def decode(self, window: list[int]) -> str:
        """``window``'s text, as the tokenizer decodes it."""
        if len(window) == 1:
            return self[window[0]]
        if self.concatenative:
            text = "".join([self[token_id] for token_id in window])
            if "\ufffd" not in text:
                return text
        return self._decode(window)

    def __missing__(self, token_id: int) -> str:
        text = self[token_id] = self._decode([token_id])
        return text


class TokenNames(dict[int, tuple[str, list[int] | None]]):
    """Each token as logprobs name it (OpenAI's ``token`` and ``bytes``): its text
    decoded alone, special tokens included, and, where that text is not whole
    characters (a byte-level token holding part of one, a byte-fallback token), the
    token's own bytes, which a client joins with its neighbours'. Decoded once per id."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__()
        self._tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._byte_level = _byte_level_bytes() if _byte_level(self._backend) else None

    def __missing__(self, token_id: int) -> tuple[str, list[int] | None]:
        decoded = self._tokenizer.decode([token_id], skip_special_tokens=False)
        text = decoded if isinstance(decoded, str) else "".join(decoded)
        raw = self._raw_bytes(token_id) if "\ufffd" in text else None
        named = self[token_id] = (text, raw)
        return named

    def _raw_bytes(self, token_id: int) -> list[int] | None:
        piece = None if self._backend is None else self._backend.id_to_token(token_id)
        if piece is None:
            return None
        fallback = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
        if fallback is not None:
            return [int(fallback.group(1), 16)]
        if self._byte_level is not None and all(c in self._byte_level for c in piece):
            return [self._byte_level[c] for c in piece]
        return None


def _byte_level(backend: Any) -> bool:
    """Whether the Rust tokenizer ``backend`` (or None) decodes byte-level tokens."""
    return isinstance(getattr(backend, "decoder", None), decoders.ByteLevel)


@cache
def _byte_level_bytes() -> dict[str, int]:
    """The byte-level alphabet's character -> the byte it stands for (GPT-2's)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}  # type: ignore[no-untyped-call]


class IncrementalDetokenizer:
    """Text deltas from a growing list of token ids.

    Each step decodes a short window behind the new tokens and emits what lies past
    the window's previously read part, holding back text that ends in an
    incomplete multi-byte character (U+FFFD) until more tokens complete it.
    """

    def __init__(
        self, tokenizer: Tokenizer, context_ids: list[int], texts: TokenTexts | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self._texts = TokenTexts.of(tokenizer) if texts is None else texts
        self.token_ids = list(context_ids[-NUM_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)

    def add(self, token_ids: list[int]) -> str:
        ids = self.token_ids
        ids.extend(token_ids)
        prefix_text = self._texts.decode(ids[self.prefix_offset : self.read_offset])
        full_text = self._texts.decode(ids[self.prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        return full_text[len(prefix_text) :]


def plain_decode(tokenizer: Tokenizer) -> Callable[[list[int]], str]:
    """Token ids to text, special tokens skipped: through the Rust tokenizer where
    ``_plain_backend`` allows."""
    backend = _plain_backend(tokenizer)
    if backend is not None:
        decode: Callable[[list[int]], str] = partial(backend.decode, skip_special_tokens=True)
        return decode

    def decode_slow(token_ids: list[int]) -> str:
        text = tokenizer.decode(token_ids, skip_special_tokens=True)
        return text if isinstance(text, str) else "".join(text)

    return decode_slow


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
        self.matched: str | None = None  # the stop string found, once one is

    def add(self, delta: str, can_stop: bool = True) -> tuple[str, bool]:
        """Append ``delta``; return the text now safe to emit and whether a stop
        string matched (the emitted text then ends right before it). With
        ``can_stop`` false (``min_tokens`` not reached yet) matches are ignored."""
        if not self.stop and self.num_emitted_chars == len(self.text):
            return delta, False  # nothing to find nor hold back: no need to keep the text
        search_from = max(0, len(self.text) - self.max_stop_len + 1)
        self.text += delta
        cut = self._find_stop(search_from) if can_stop else None
        if cut is not None:
            return self._emit_until(cut), True
        return self._emit_until(len(self.text) - self._num_held_back()), False

    def flush(self) -> str:
        return self._emit_until(len(self.text))

    def _find_stop(self, search_from: int) -> int | None:
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, search_from)) >= 0]
        if not hits:
            return None
        at, self.matched = min(hits)
        return at

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
