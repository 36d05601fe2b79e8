"""Verification: how many proposed tokens a step keeps.

Each verified position ``j`` of a row (its last real token, then each draft token)
yields a target token ``x_j``, drawn by the sampler from the target distribution ``p_j``
as every other token is (greedy: its argmax; sampled: its seeded or fresh draw). The
draft token ``d_j`` is kept while ``x_j == d_j``; at the first mismatch ``x_j`` is kept
instead, and after ``k`` kept drafts the step emits ``x_k`` too (the bonus token).

For an n-gram proposal the draft distribution is a point mass on ``d_j``, and this is
exactly rejection sampling: ``x_j == d_j`` has probability ``p_j(d_j)``, the acceptance
probability ``min(1, p/q)`` with ``q = 1[d_j]``; given a mismatch, ``x_j`` is distributed
as ``p_j`` without ``d_j``, renormalized, which is the residual ``(p_j - q)+``. The draw
is coupled to the one the engine would make without speculation (same key for the same
output index), so a seeded request samples the same tokens either way.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq


def num_accepted(target_ids: Seq[int], draft_ids: Seq[int]) -> int:
    """How many leading draft tokens the targets keep (``len(target_ids)`` is
    ``len(draft_ids) + 1``: the last target is the bonus token)."""
    for j, draft in enumerate(draft_ids):
        if target_ids[j] != draft:
            return j
    return len(draft_ids)
