"""Coalescing: what engine steps produce is held for a short window, then written in one
round trip, each request's steps as one stream entry.

Per token, Redis then runs a fraction of a script call, a fraction of an XADD and its
hash updates, and wakes a fraction of the readers' blocked XREADs. The whole worker
writes at once (not each request on its own clock), so a worker makes one round trip
per window rather than one per step, and readers wake once per window.

Exactly-once and fencing are unchanged: a written entry is still fenced by the lease
token and made idempotent by the index of its first token; what was taken for a write
is sent again, unchanged, until Redis acknowledges it (the engine computes at most
``MAX_STEPS_WRITING`` steps meanwhile: those the write overlaps, whose outputs are held
for the write after it), so a retried write never differs from one that went through. What a
worker holds when it loses a lease or dies was never written: the next worker
regenerates it from the last written token.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.models import token_wire
from worker.engine.outputs import RequestOutput

NUM_DELAYS_KEPT = 4_096
# The next chance to write is taken to come as late as the latest of the last few did:
# an engine step that runs long (a prefill joins), a slow claim round trip, a busy host
# that starves the loop, all of which could hold a token past the window.
NUM_STEPS_KEPT = 16
NUM_GAPS_KEPT = 32


@dataclass
class Coalescer:
    """Holds step outputs; ``due`` says when the oldest one must go out."""

    window_s: float
    clock: Callable[[], float] = time.monotonic
    _held: dict[str, list[RequestOutput]] = field(default_factory=dict)
    _added_s: dict[int, float] = field(default_factory=dict)  # id(output) -> when held
    _oldest_s: float | None = None
    delays_s: deque[float] = field(default_factory=lambda: deque(maxlen=NUM_DELAYS_KEPT))
    steps_s: deque[float] = field(default_factory=lambda: deque(maxlen=NUM_STEPS_KEPT))
    # Time between consecutive calls of ``due`` while holding: the loop's chances to write.
    gaps_s: deque[float] = field(default_factory=lambda: deque(maxlen=NUM_GAPS_KEPT))
    _asked_s: float | None = None  # when ``due`` was last asked while holding

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def add(self, outputs: list[RequestOutput], step_s: float = 0.0) -> None:
        """Hold what a step produced; ``step_s`` is how long that step took."""
        self.steps_s.append(step_s)
        now = self.clock()
        for out in outputs:
            self._held.setdefault(out.request_id, []).append(out)
            self._added_s[id(out)] = now
        if outputs and self._oldest_s is None:
            self._oldest_s = now

    def due(self) -> bool:
        """Whether this is the last chance to write before the oldest held output's
        deadline (held + window): the next chance is taken to come as late as the
        latest of the recent ones (or of the recent engine steps), measured on the
        loop as it runs, so claims, writes and a starved host count as well as the step.
        None then waits past the window unless the loop suddenly slows past all its
        recent turns."""
        if self._oldest_s is None:
            return False
        now = self.clock()
        if self._asked_s is not None:
            self.gaps_s.append(now - self._asked_s)
        self._asked_s = now
        if self.window_s <= 0:
            return True
        next_chance_s = max(max(self.gaps_s, default=0.0), max(self.steps_s, default=0.0))
        return now + next_chance_s - self._oldest_s > self.window_s

    def take(self) -> list[RequestOutput]:
        """Everything held, one merged output per request, in the order first held."""
        now = self.clock()
        groups = list(self._held.values())
        for group in groups:
            self.delays_s.extend(now - self._added_s[id(out)] for out in group)
        self._held, self._added_s, self._oldest_s, self._asked_s = {}, {}, None, None
        return [merge(group) for group in groups]

    def discard(self, request_id: str) -> None:
        """Drop what is held for a request this worker no longer holds."""
        for out in self._held.pop(request_id, []):
            del self._added_s[id(out)]
        if not self._held:
            self._oldest_s, self._asked_s = None, None

    def p99_delay_ms(self) -> float:
        """The 99th percentile of how long recent outputs were held."""
        if not self.delays_s:
            return 0.0
        ordered = sorted(self.delays_s)
        return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)] * 1000


@dataclass
class Merged(RequestOutput):
    """Several consecutive step outputs of one request as one. ``steps`` is each step's
    number of tokens and of text characters (``TokenEvent.steps``), so that readers can
    split the stream entry again; None when a single step had any."""

    steps: list[tuple[int, int]] | None = None


def step_wire(out: RequestOutput) -> bytes:
    """The stream entry of ``out`` (one step's tokens, or several steps' merged): the
    bytes ``TokenEvent.wire`` gives for it, built without the model."""
    steps = out.steps if isinstance(out, Merged) else None
    return token_wire(out.index, out.new_token_ids, out.text, out.logprobs or None, steps)


def merge(group: list[RequestOutput]) -> RequestOutput:
    """One request's held outputs as one, as ``TokenEvent.coalesce`` would merge their
    events; built from the outputs themselves, since going through the event models
    costs a parse and a dump on the writer's path."""
    if len(group) == 1:
        return group[0]
    steps = [o for o in group if o.new_token_ids or o.text]
    first, last = (steps or group)[0], group[-1]
    with_logprobs = bool(steps) and all(o.logprobs for o in steps)
    return Merged(
        request_id=last.request_id,
        index=first.index,
        new_token_ids=[t for o in steps for t in o.new_token_ids],
        text="".join(o.text for o in steps),
        finish_reason=last.finish_reason,
        logprobs=[x for o in steps for x in o.logprobs or ()] if with_logprobs else None,
        num_prompt_tokens=last.num_prompt_tokens,
        num_output_tokens=last.num_output_tokens,
        error=last.error,
        embedding=last.embedding,
        prompt_logprobs=last.prompt_logprobs,
        stop_sequence=last.stop_sequence,
        num_prefix_queried_tokens=last.num_prefix_queried_tokens,
        num_prefix_hit_tokens=last.num_prefix_hit_tokens,
        refusal=last.refusal,
        steps=[(len(o.new_token_ids), len(o.text)) for o in steps] if len(steps) > 1 else None,
    )
