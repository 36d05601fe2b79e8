"""Embeddings: the pooled, L2-normalised hidden state of an embed request's prompt.

Pure Python. The runner reduces each chunk of a prompt it computes (a sum of the
chunk's final hidden states for ``mean``, its last row for ``last``, its first for
``cls``); the pooler combines a request's chunks, which may come over several
steps, and normalises once the prompt is done.
"""

from __future__ import annotations

import math

POOLING_METHODS = ("mean", "last", "cls")


class Pooler:
    def __init__(self, method: str) -> None:
        if method not in POOLING_METHODS:
            raise ValueError(f"unknown pooling {method!r}: use one of {', '.join(POOLING_METHODS)}")
        self.method = method
        self._partials: dict[str, list[float]] = {}

    def add(self, request_id: str, partial: list[float]) -> None:
        """One chunk's reduction, in the order the chunks were computed."""
        held = self._partials.get(request_id)
        if held is None or self.method == "last":
            self._partials[request_id] = partial
        elif self.method == "mean":
            self._partials[request_id] = [a + b for a, b in zip(held, partial, strict=True)]

    def discard(self, request_id: str) -> None:
        """Forget a request's chunks (preempted: it is computed again from its start)."""
        self._partials.pop(request_id, None)

    def finish(self, request_id: str, dimensions: int | None = None) -> list[float]:
        """The request's embedding: its first ``dimensions`` values, normalised. A mean
        needs no division by the token count, which normalising cancels."""
        vector = self._partials.pop(request_id)[:dimensions]
        norm = math.sqrt(math.fsum(v * v for v in vector))
        return [v / norm for v in vector] if norm > 0 else vector
