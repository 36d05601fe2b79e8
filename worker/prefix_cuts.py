"""Where a request's prefix fingerprints (``shared.prefixes``) fall in its prompt's
tokens: the worker renders each cut's content alone and keeps as many tokens as it
shares with the whole prompt. The KV cache tracks each fingerprint against the blocks
up to its cut, and the worker publishes those it holds warm."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

from shared.models import GenerationRequest
from shared.prefixes import Cut, cuts

log = logging.getLogger(__name__)

# Cuts' renderings kept: a shared system prompt is rendered once, not per request.
MAX_RENDERINGS = 256


class Encoder(Protocol):
    def encode_prompt(self, prompt: str) -> list[int]: ...
    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]: ...


class PrefixCuts:
    """Maps a request's cuts to token counts, remembering recent cuts' renderings."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self._renderings: OrderedDict[str, list[int]] = OrderedDict()

    def of(
        self, req: GenerationRequest, ids: Sequence[int], salt: bytes
    ) -> tuple[tuple[str, int], ...]:
        """(fingerprint, prompt tokens up to its cut) for each cut that renders to a
        prefix of ``ids``; none when prefix affinity cannot use them. ``salt``: the
        request's cache salt, which its fingerprints and its blocks' digests start from."""
        out = []
        for cut in cuts(req, salt):
            rendered = self._rendering(req, cut)
            num_tokens = _common_prefix(rendered, ids) if rendered is not None else 0
            if num_tokens:
                out.append((cut.fingerprint, num_tokens))
        return tuple(out)

    def _rendering(self, req: GenerationRequest, cut: Cut) -> list[int] | None:
        rendered = self._renderings.get(cut.fingerprint)
        if rendered is None:
            try:
                rendered = self._render(req, cut)
            except Exception as e:  # a template that refuses a partial conversation
                log.debug("cut %s does not render alone (%r): not tracked", cut, e)
                return None
            self._renderings[cut.fingerprint] = rendered
            if len(self._renderings) > MAX_RENDERINGS:
                self._renderings.popitem(last=False)
        self._renderings.move_to_end(cut.fingerprint)
        return rendered

    def _render(self, req: GenerationRequest, cut: Cut) -> list[int]:
        if cut.num_token_ids is not None:
            return list((req.prompt_token_ids or ())[: cut.num_token_ids])
        if cut.num_chars is not None:
            return self.encoder.encode_prompt((req.prompt or "")[: cut.num_chars])
        messages = [m.template_view() for m in (req.messages or ())[: cut.num_messages]]
        tools = None if req.tools is None else [
            {"type": "function", "function": t.model_dump()} for t in req.tools
        ]  # fmt: skip
        return self.encoder.encode_chat(messages, tools, req.chat_template_kwargs)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
