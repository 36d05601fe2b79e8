"""Weighted fair order between tenants within a priority: start-time fair queuing
over service counted in tokens (the VTC paper's measure of service).

Why tags on the one queue rather than a sub-queue per tenant: the queue's score
already orders work by priority (band) and then by a number within the band; every
reader (claim, queue position, dashboard bands, put-back, cancel) keys off that score.
Making that number a *virtual start time* gives the fair order without a second
structure to keep in step:

* Each tenant has, per priority band, a virtual finish time F (``Keys.fair_tags``).
  A request enqueued at virtual time V (``Keys.fair_clock``: the start tag of the
  newest fresh request claimed in that band) starts at S = max(F, V) and moves F to
  S + cost / weight. Its queue score is its band plus S.
* Claiming always takes the lowest score, so within a band the tenant with the least
  service so far (F) goes first, in proportion to its weight; a tenant's own requests
  keep their order (their tags only grow).
* max(F, V) is what stops an idle tenant from banking credit: it comes back at the
  current virtual time, level with the busiest tenant's head, never behind it.
* Cost is charged in two parts, as VTC charges prompt tokens at admission and output
  tokens as they are made: an estimate at enqueue (``estimated_tokens``), then at
  finish whatever the request used beyond it (``excess_tokens``), which moves the
  tenant's F for its later work. An over-estimate is not refunded: a refund could
  put a tenant's next request ahead of its own queued ones.

Tags are in ``FAIR_UNITS_PER_TOKEN`` units so that weights like 3:1 round well.
A band holds 2**45 units, about 2 * 10**12 tokens of service at weight 1; past that
enqueue.lua pins the tag at the band's end (order within the band degrades to ties,
priority still dominates).
"""

from __future__ import annotations

import math

from shared.models import GenerationRequest

FAIR_UNITS_PER_TOKEN = 16
CHARS_PER_TOKEN = 4  # the usual English estimate; the finish charge corrects it
OUTPUT_ESTIMATE_TOKENS = 16  # charged up front, the rest at finish


def estimated_prompt_tokens(req: GenerationRequest) -> int:
    return max(1, math.ceil(req.prompt_chars() / CHARS_PER_TOKEN))


def estimated_tokens(req: GenerationRequest) -> int:
    """What enqueue charges a request: its prompt, estimated, and a little output."""
    output = 0 if req.task == "embed" else min(req.sampling.max_tokens, OUTPUT_ESTIMATE_TOKENS)
    return estimated_prompt_tokens(req) + output


def excess_tokens(req: GenerationRequest, prompt_tokens: int, completion_tokens: int) -> int:
    """What a finished request used beyond what enqueue charged (never negative)."""
    return max(0, prompt_tokens + completion_tokens - estimated_tokens(req))


def units(num_tokens: int, weight: float) -> int:
    """Virtual time for ``num_tokens`` of service at ``weight`` (at least 1 when any)."""
    if num_tokens <= 0:
        return 0
    return max(1, round(num_tokens * FAIR_UNITS_PER_TOKEN / weight))


def fair_member(priority: int, tenant: str | None) -> str:
    """A tenant's entry in ``Keys.fair_tags``: one per priority band."""
    return f"{priority}:{tenant or ''}"
