"""n-gram (prompt lookup) proposals: the tokens that followed the latest earlier
occurrence of a sequence's last few tokens, in its own prompt and output.

Input-grounded answers (summaries, code edits, extraction) copy spans of their input,
so once an answer starts a copied span its continuation is already in the context.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from worker.engine.request import Sequence


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def propose_many(self, wanted: dict[int, tuple[Sequence, int]]) -> dict[int, list[int]]:
        """Up to ``limit`` tokens for each ``(seq, limit)`` of ``wanted``, by its key."""
        return {at: self.propose(seq.token_ids, limit) for at, (seq, limit) in wanted.items()}

    def release_gone(self) -> None:
        """Nothing to release: proposals are read from the sequence's own tokens."""

    def propose(self, token_ids: Seq[int], max_num_tokens: int) -> list[int]:
        """Up to ``max_num_tokens`` tokens after the latest earlier match of the longest
        suffix (``max_n`` down to ``min_n`` tokens) that has one; [] when none has."""
        if max_num_tokens <= 0:
            return []
        num_tokens = len(token_ids)
        for n in range(min(self.max_n, num_tokens - 1), self.min_n - 1, -1):
            start = _latest_match(token_ids, n)
            if start is not None:
                follow = start + n
                return list(token_ids[follow : follow + max_num_tokens])
        return []


def _latest_match(token_ids: Seq[int], n: int) -> int | None:
    """Where the latest earlier occurrence of the last ``n`` tokens starts (one with at
    least one token after it), or None."""
    num_tokens = len(token_ids)
    suffix = list(token_ids[num_tokens - n :])
    last = suffix[-1]
    for start in range(num_tokens - n - 1, -1, -1):
        if token_ids[start + n - 1] == last and list(token_ids[start : start + n]) == suffix:
            return start
    return None
