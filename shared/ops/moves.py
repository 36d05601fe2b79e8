"""What a one-slot step on a request's slot made of it (start, finish, fence, cancel,
expire), and settle.lua, which moves the id on the model's slot accordingly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.fairness import fair_member
from shared.keys import Keys
from shared.replies import text
from shared.scripts import ScriptCall


class Fate(StrEnum):
    """A request's state as a request-slot script found or left it; MISSING: no hash."""

    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    DEAD = "dead"
    MISSING = "missing"

    @property
    def terminal(self) -> bool:
        return self not in (Fate.QUEUED, Fate.RUNNING, Fate.MISSING)


@dataclass(frozen=True)
class Moved:
    """What a one-slot step on a request's slot made of it, for settle.lua."""

    request_id: str
    lease_token: str  # '' for a request no worker held
    state: Fate
    finished_ms: str = ""
    fenced: bool = False  # fence.lua took it from its lease token in this call
    # Put back having published nothing: it goes among new work, not ahead of it.
    unstarted: bool = False


def parse_moved(reply: Sequence[Any], request_id: str, token: str = "") -> Moved:
    """fence.lua's, cancel.lua's and expire.lua's reply: {state, finished ms, ['1' when
    fenced here, ['1' when it published nothing]]}."""
    fenced = len(reply) > 2 and text(reply[2]) == "1"
    unstarted = len(reply) > 3 and text(reply[3]) == "1"
    return Moved(request_id, token, _fate(reply[0]), text(reply[1]), fenced, unstarted)


def _fate(value: Any) -> Fate:
    return Fate(text(value))


@dataclass(frozen=True)
class Charge:
    """Service beyond the enqueue estimate, to charge a tenant in its priority band."""

    priority: int
    tenant: str | None
    units: int


@dataclass(frozen=True)
class Settle:
    """settle.lua: move ids on the model's slot after their own slots said what became
    of them (drop leases; put back in the queue or file as ended), and charge tenants
    what finished requests used beyond the estimate (``shared.fairness``)."""

    tag: str
    moved: Sequence[Moved]
    charges: Sequence[Charge] = ()

    def call(self, keys: Keys) -> ScriptCall:
        quints = [
            x
            for m in self.moved
            for x in (
                m.request_id,
                m.lease_token,
                m.state.value,
                m.finished_ms,
                "1" if m.unstarted else "",
            )
        ]
        triples = [
            a
            for c in self.charges
            for a in (c.priority, fair_member(c.priority, c.tenant), c.units)
        ]
        tag = self.tag
        return ScriptCall(
            "settle",
            [
                keys.leases(tag),
                keys.owners(tag),
                keys.scores(tag),
                keys.queue(tag),
                keys.wakeup(tag),
                keys.deadlines(tag),
                keys.dead(tag),
                keys.recent(tag),
                keys.failed(tag),
                keys.lora_ranks(tag),
                keys.fair_clock(tag),
                keys.fair_tags(tag),
                keys.prefixes(tag),
                keys.passes(tag),
            ],
            [keys.lifecycle_channel(), len(self.moved), *quints, *triples],
        )


class FenceMode(StrEnum):
    REAP = "reap"  # its lease expired: counts as an attempt
    RELEASE = "release"  # its worker hands it back: the attempt is given back


@dataclass(frozen=True)
class Fence:
    """fence.lua: take a request from a lease token (reap or release)."""

    request_id: str
    lease_token: str
    mode: FenceMode

    def call(self, keys: Keys, max_attempts: int, ttl_s: int) -> ScriptCall:
        rid = self.request_id
        return ScriptCall(
            "fence",
            [keys.request(rid), keys.stream(rid)],
            [rid, self.lease_token, self.mode.value, max_attempts, ttl_s, keys.lifecycle_channel()],
        )

    def parse(self, reply: Sequence[Any]) -> Moved:
        return parse_moved(reply, self.request_id, self.lease_token)


class EndScript(StrEnum):
    """The request-slot scripts that end a request no worker holds (same KEYS and ARGV)."""

    CANCEL = "cancel"
    EXPIRE = "expire"


class EndOutcome(StrEnum):
    CANCELLED = "cancelled"  # cancel.lua: it was queued, and is ended now
    EXPIRED = "expired"  # expire.lua: its deadline passed while queued; ended now
    REQUESTED = "requested"  # cancel.lua: running; its worker stops it within a step
    DONE = "done"  # cancel.lua: it had already ended
    MISSING = "missing"  # no such request (or it expired)
    KEPT = "kept"  # expire.lua: not due (running, ended, or its deadline is ahead)


@dataclass(frozen=True)
class Ended:
    outcome: EndOutcome
    moved: Moved | None  # what settle.lua moves: only a request ended here


@dataclass(frozen=True)
class End:
    """cancel.lua or expire.lua on one request."""

    script: EndScript
    request_id: str

    def call(self, keys: Keys, ttl_s: int) -> ScriptCall:
        rid = self.request_id
        return ScriptCall(
            self.script.value,
            [keys.request(rid), keys.stream(rid)],
            [rid, ttl_s, keys.lifecycle_channel()],
        )

    def parse(self, reply: Sequence[Any]) -> Ended:
        word = text(reply[0])
        if word in (EndOutcome.CANCELLED, EndOutcome.EXPIRED):
            moved = Moved(self.request_id, "", Fate(word), text(reply[1]))
            return Ended(EndOutcome(word), moved)
        if word in (EndOutcome.REQUESTED, EndOutcome.DONE, EndOutcome.MISSING):
            return Ended(EndOutcome(word), None)
        return Ended(EndOutcome.KEPT, None)
