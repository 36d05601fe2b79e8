"""Constrained decoding: grammars compiled from guided_json / guided_regex (with
xgrammar), cached by their source, and one matcher per sequence.

A matcher follows the tokens its sequence generates; the sampler asks it for the
mask of tokens that may come next. A resumed request replays the tokens it already
has into a fresh matcher, so it continues where it was.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from functools import cached_property
from typing import Any

import orjson
import torch

from shared.models import SamplingParams

# xgrammar prefixes its errors with a timestamp and a C++ source location.
_CPP_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class GrammarError(ValueError):
    """A guided_json / guided_regex that cannot be compiled into a grammar."""


class GrammarState:
    """One sequence's matcher (what the sampler's ``TokenMask`` protocol asks for)."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, index)

    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False when the grammar does not allow it."""
        if self.matcher.is_terminated():
            return False
        return bool(self.matcher.accept_token(token_id))

    @property
    def terminated(self) -> bool:
        """The output is complete: only a stop token could come next, and it came."""
        return bool(self.matcher.is_terminated())


class Grammars:
    """Compiles and caches grammars for one tokenizer; thread-safe."""

    def __init__(
        self, tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int], max_threads: int = 1
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.max_threads = max_threads
        self._lock = threading.Lock()

    @cached_property
    def _compiler(self) -> Any:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(
            self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
        )
        return xgr.GrammarCompiler(info, max_threads=self.max_threads, cache_enabled=True)

    def compile(self, params: SamplingParams) -> Any:
        """The compiled grammar for ``params`` (from the cache when seen before)."""
        with self._lock:
            compiler = self._compiler
        try:
            if params.guided_json is not None:
                schema = orjson.dumps(params.guided_json, option=orjson.OPT_SORT_KEYS).decode()
                return compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=False)
            if params.guided_regex is not None:
                return compiler.compile_regex(params.guided_regex)
        except RuntimeError as e:
            raise GrammarError(_describe(params, e)) from e
        raise GrammarError("the request has no guided_json or guided_regex")

    def matcher(self, params: SamplingParams, output_token_ids: Iterable[int] = ()) -> GrammarState:
        """A fresh matcher that has followed ``output_token_ids`` (a resume's tokens)."""
        import xgrammar as xgr

        state = GrammarState(xgr.GrammarMatcher(self.compile(params)))
        for token_id in output_token_ids:
            if not state.accept(token_id):
                break
        return state


def _describe(params: SamplingParams, error: RuntimeError) -> str:
    field = "guided_json" if params.guided_json is not None else "guided_regex"
    detail = _CPP_PREFIX.sub("", str(error).strip().splitlines()[0])
    return f"{field}: cannot be used for constrained decoding: {detail}"
