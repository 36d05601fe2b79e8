"""Prefix fingerprints: what a claim knows of a request's leading content without a
tokenizer (the producer side has none).

A request's fingerprints are chained hashes of its leading content at a few cut
points, shortest first: a chat's first message (its system prompt), then the last
few further messages (each cut covers every message before it); a plain prompt's
leading character spans; a prompt of token ids' leading id spans. Each hash covers the
one before it, so two requests share a fingerprint only if they share everything up
to its cut. The adapter, the tools and the template's arguments seed the chain: they
change the tokens (or the cached keys and values) of everything after them; so does the
request's cache salt (``shared.cache_scope``), the same that seeds the worker's block
digests, so that a warm set never matches a request that could not use its blocks.

enqueue.lua keeps them on the model's slot; each worker publishes the fingerprints it
holds in its prefix cache (warm.lua); claim.lua prefers a warm match (bounded). The
worker maps each cut to the tokens it renders to (``worker.prefix_cuts``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from shared.models import GenerationRequest

MAX_CUTS = 4
# A plain prompt's cut points in characters, and a token-id prompt's in ids: doubling,
# so a long shared preamble is matched at about its length, with few cuts.
CHAR_CUTS = tuple(512 << i for i in range(MAX_CUTS))
TOKEN_CUTS = tuple(256 << i for i in range(MAX_CUTS))
FINGERPRINT_BYTES = 8


@dataclass(frozen=True)
class Cut:
    """One cut point: the request's content up to it has ``fingerprint``. Exactly one
    of the lengths is set, in the unit of the request's kind of prompt."""

    fingerprint: str
    num_messages: int | None = None
    num_chars: int | None = None
    num_token_ids: int | None = None


def cuts(req: GenerationRequest, salt: bytes) -> list[Cut]:
    """The request's cut points, shortest first (none for an embed request: it takes no
    cached prefix); ``salt`` is its cache salt (``shared.cache_scope.cache_salt``)."""
    if req.task == "embed":
        return []
    seed = _seed(req, salt)
    if req.messages is not None:
        return _chat_cuts(seed, [m.template_view() for m in req.messages])
    if req.prompt is not None:
        points = [n for n in CHAR_CUTS if n <= len(req.prompt)]
        pieces = _spans(req.prompt, points)
        return [Cut(fp, num_chars=n) for fp, n in zip(_chain(seed, pieces), points, strict=True)]
    ids = req.prompt_token_ids or ()
    points = [n for n in TOKEN_CUTS if n <= len(ids)]
    pieces = [orjson.dumps(list(ids[a:b])) for a, b in zip([0, *points], points, strict=False)]
    return [Cut(fp, num_token_ids=n) for fp, n in zip(_chain(seed, pieces), points, strict=True)]


def fingerprints(req: GenerationRequest, salt: bytes) -> list[str]:
    """The request's fingerprints, shortest cut first."""
    return [c.fingerprint for c in cuts(req, salt)]


def _chat_cuts(seed: bytes, messages: list[dict[str, Any]]) -> list[Cut]:
    """After the first message, then after each of the last MAX_CUTS - 1 further ones:
    a conversation's next turn starts with the previous turn's messages."""
    pieces = [orjson.dumps(m, option=orjson.OPT_SORT_KEYS) for m in messages]
    chained = _chain(seed, pieces)
    counts = [1, *range(max(2, len(messages) - MAX_CUTS + 2), len(messages) + 1)]
    return [Cut(chained[n - 1], num_messages=n) for n in counts]


def _spans(prompt: str, points: list[int]) -> list[bytes]:
    return [prompt[a:b].encode() for a, b in zip([0, *points], points, strict=False)]


def _seed(req: GenerationRequest, salt: bytes) -> bytes:
    tools = None if req.tools is None else [t.model_dump() for t in req.tools]
    context: list[Any] = [req.lora, tools, req.chat_template_kwargs]
    if salt:  # unsalted: the chain as it was before salts
        context.append(salt.hex())
    return orjson.dumps(context, option=orjson.OPT_SORT_KEYS)


def _chain(seed: bytes, pieces: Iterable[bytes]) -> list[str]:
    out: list[str] = []
    last = hashlib.blake2b(seed, digest_size=FINGERPRINT_BYTES).digest()
    for piece in pieces:
        h = hashlib.blake2b(last, digest_size=FINGERPRINT_BYTES)
        h.update(len(piece).to_bytes(8, "little"))
        h.update(piece)
        last = h.digest()
        out.append(last.hex())
    return out
