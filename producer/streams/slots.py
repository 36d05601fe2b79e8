"""Reading followed streams on a Redis Cluster: one pipeline per node, one XREAD per slot.

XREAD over several keys must keep to one hash slot on a cluster, and requests' streams
spread over the slots, so a blocking XREAD cannot cover the streams a process follows.
Instead each node gets one pipelined round trip holding one non-blocking XREAD per
followed slot, repeated on a short interval that stretches while nothing arrives.

What a round costs is the number of XREADs (each a command to build, route, parse and
answer, on both sides) plus the streams they name. Request tags fall on a bounded set
of slots spread evenly over the slot range (``shared.keys.REQUEST_SLOTS``: 96, so 32 on
each of three masters), so a round is at most that many XREADs however many streams
are followed, and a reader's CPU per entry stays close to what it is on one Redis
(bench/scale_readers.py; docs/benchmarks.md has the figures). 96 keeps each master's
share even on up to a dozen masters.
The other design considered, a per-node doorbell that workers ring so quiet streams
are not polled, costs a second write per publish on a key of another slot (a script
may not touch it, so another command and round trip on a cluster), and still needs a
read per followed slot once it rings. Streams of requests from before the bounded slots
are read the same way, one XREAD per slot they fall on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from redis.crc import key_slot

# Pause between rounds: BUSY_S after a round that found entries, doubling while rounds
# find none, up to QUIET_S (the most a first token waits on top of its publish).
BUSY_S = 0.005
QUIET_S = 0.05
COUNT = 512


@dataclass
class NodeReads:
    """The XREADs one node gets in a round: one {stream: cursor} per slot."""

    node: Any
    by_slot: dict[int, dict[str, str]] = field(default_factory=dict)

    @property
    def reads(self) -> list[dict[str, str]]:
        return list(self.by_slot.values())


@lru_cache(maxsize=1 << 16)
def stream_slot(key: str) -> int:
    """A stream key's hash slot, kept: a round asks again for every followed stream."""
    return key_slot(key.encode())


def plan_reads(
    cursors: Mapping[str, str],
    node_of_slot: Callable[[int], Any],
    slot_of: Callable[[str], int] = stream_slot,
) -> dict[str, NodeReads]:
    """The round's reads by node name (``node_of_slot`` gives an object with ``.name``),
    looking each slot's node up once a round."""
    by_slot: dict[int, dict[str, str]] = {}
    for key, cursor in cursors.items():
        by_slot.setdefault(slot_of(key), {})[key] = cursor
    plan: dict[str, NodeReads] = {}
    for slot, streams in by_slot.items():
        node = node_of_slot(slot)
        plan.setdefault(node.name, NodeReads(node)).by_slot[slot] = streams
    return plan


class Pacer:
    """How long to wait before the next round: short while entries flow."""

    def __init__(self, busy_s: float = BUSY_S, quiet_s: float = QUIET_S) -> None:
        self.busy_s, self.quiet_s = busy_s, quiet_s
        self.delay_s = busy_s

    def after_round(self, found: bool) -> float:
        self.delay_s = self.busy_s if found else min(self.delay_s * 2, self.quiet_s)
        return self.delay_s


def xread_args(streams: dict[str, str]) -> tuple[object, ...]:
    """A non-blocking XREAD, spelled out (redis-py's ``xread`` checks its arguments at a
    cost that shows at thousands of streams per round)."""
    return ("XREAD", "COUNT", COUNT, "STREAMS", *streams, *streams.values())


def is_redirect(error: Exception) -> bool:
    """A MOVED or ASK reply: the slot map changed under us."""
    message = str(error)
    return message.startswith(("MOVED", "ASK"))
