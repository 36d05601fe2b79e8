"""claim.lua (the model's slot) and start.lua (each request's slot): the two steps of a
claim. settle.lua (``shared.ops.moves``) then drops the leases of what may not start."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.keys import Keys
from shared.ops.moves import Fate, Moved
from shared.ops.slots import by_slot, slot_of
from shared.replies import text
from shared.scripts import ScriptCall

# Queue entries past its candidates that a claim looks at for requests the worker can
# serve, in place of candidates whose LoRA rank it cannot (claim.lua): bounded, so a
# queue full of adapter requests costs a base-only worker a short look per claim.
CLAIM_LOOK_PAST = 64
# Prefix affinity (claim.lua): new requests of the highest waiting priority a claim looks
# at for one whose prefix the worker holds warm, and how long one may be passed over for
# such a match (claims or ms, whichever comes first) before any claim takes it first.
AFFINITY_WINDOW = 16
AFFINITY_MAX_PASSES = 16
AFFINITY_MAX_PASS_MS = 1_000
# Added to the mark (shared.keys.lora_ranks) of a request that asks for structured
# outputs: only a worker that serves them claims it. Above any LoRA rank, so a mark is
# GUIDED_MARK * guided + rank.
GUIDED_MARK = 1 << 16


@dataclass(frozen=True)
class Leased:
    """A request claim.lua leased: one group of its reply."""

    request_id: str
    lease_token: str
    by_affinity: bool = False  # taken for a warm prefix ahead of the plain claim's pick


# Reply fields per leased request (a field added to claim.lua's reply is added here,
# to ``Leased`` and to ``Claim.parse``).
LEASED_FIELDS = 3


@dataclass(frozen=True)
class ClaimReply:
    leased: list[Leased]
    malformed: list[str]  # queue entries that were not request ids, taken off the queue


@dataclass(frozen=True)
class Claim:
    """claim.lua: lease the queue's heads for ``worker_id``: resumed requests up to
    ``room``, new ones up to ``free`` in all. ``max_lora_rank``: the largest adapter rank
    the worker serves (0: none); None claims every head whatever its adapter.
    ``affinity_window``: how many new requests of the highest waiting priority it looks
    at for a prefix it holds warm (0: off, the plain claim)."""

    tag: str
    worker_id: str
    lease_ms: int
    room: int
    free: int
    max_lora_rank: int | None = None
    look_past: int = CLAIM_LOOK_PAST
    affinity_window: int = AFFINITY_WINDOW
    max_passes: int = AFFINITY_MAX_PASSES
    max_pass_ms: int = AFFINITY_MAX_PASS_MS
    guided: bool = True  # the worker serves structured outputs
    # The model's other live workers (warm.lua's reply): a request one of them holds
    # warmer than this worker is left to it, within the pass-over bound.
    peers: Sequence[str] = ()

    def call(self, keys: Keys) -> ScriptCall:
        tag = self.tag
        return ScriptCall(
            "claim",
            [
                keys.queue(tag),
                keys.leases(tag),
                keys.owners(tag),
                keys.scores(tag),
                keys.seq(tag),
                keys.fair_clock(tag),
                keys.fair_tags(tag),
                keys.lora_ranks(tag),
                keys.paused(tag),
                keys.prefixes(tag),
                keys.warm(tag, self.worker_id),
                keys.passes(tag),
                *(keys.warm(tag, peer) for peer in self.peers),
            ],
            [
                self.worker_id,
                self.lease_ms,
                "" if self.max_lora_rank is None else self.max_lora_rank,
                self.look_past,
                self.room,
                self.free,
                "1" if self.guided else "0",
                GUIDED_MARK,
                self.affinity_window,
                self.max_passes,
                self.max_pass_ms,
            ],
        )

    @staticmethod
    def parse(reply: Sequence[Any]) -> ClaimReply:
        flat, malformed = reply
        leased = [
            Leased(text(flat[i]), text(flat[i + 1]), text(flat[i + 2]) == "1")
            for i in range(0, len(flat), LEASED_FIELDS)
        ]
        return ClaimReply(leased, [text(m) for m in malformed])


@dataclass(frozen=True)
class Claimed:
    """A request that start.lua marked running under its lease token."""

    request_id: str
    lease_token: str
    payload: str
    attempts: int
    num_generated: int
    by_affinity: bool = False  # claimed for a prefix this worker holds warm
    # When it was queued and when it started here (Redis's clock): its queue wait.
    created_ms: int | None = None
    started_ms: int | None = None


class StartOutcome(StrEnum):
    STARTED = "started"


@dataclass(frozen=True)
class Start:
    """start.lua: mark leased requests running, each if its hash still says it may run:
    one call for them all on one Redis, one per slot on a cluster."""

    leased: Sequence[Leased]
    worker_id: str

    def calls(self, keys: Keys, ttl_s: int, cluster: bool) -> list[ScriptCall]:
        """The calls, each request in the order ``ordered`` gives (by slot on a cluster)."""
        return [self._call(keys, ttl_s, run) for run in by_slot(self.ordered(cluster), cluster)]

    def ordered(self, cluster: bool) -> list[Leased]:
        if not cluster:
            return list(self.leased)
        return sorted(self.leased, key=lambda x: slot_of(x.request_id))

    def _call(self, keys: Keys, ttl_s: int, run: Sequence[Leased]) -> ScriptCall:
        ids = [x.request_id for x in run]
        return ScriptCall(
            "start",
            [k for i in ids for k in (keys.request(i), keys.stream(i))],
            [
                self.worker_id,
                ttl_s,
                keys.lifecycle_channel(),
                *(a for x in run for a in (x.request_id, x.lease_token)),
            ],
        )

    def parse(self, replies: Sequence[Sequence[Any]], cluster: bool) -> list[Claimed | Moved]:
        """Claimed, or what became of a request that may not start (settle drops its
        lease), in the order of ``leased`` (queue order)."""
        each = [r for reply in replies for r in reply]
        by_id = {x.request_id: r for x, r in zip(self.ordered(cluster), each, strict=True)}
        return [_started(x, by_id[x.request_id]) for x in self.leased]


def _started(leased: Leased, reply: Sequence[Any]) -> Claimed | Moved:
    rid, token = leased.request_id, leased.lease_token
    if text(reply[0]) == StartOutcome.STARTED:
        created, started = (int(reply[4]), int(reply[5])) if len(reply) > 5 else (None, None)
        return Claimed(rid, token, text(reply[1]), int(reply[2]), int(reply[3]),
                       leased.by_affinity, created, started)  # fmt: skip
    return Moved(rid, token, Fate(text(reply[0])), text(reply[1]))
