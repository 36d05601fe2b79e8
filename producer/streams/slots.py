"""Reading followed streams on a Redis Cluster: one pipeline per node, one XREAD per slot.

XREAD over several keys must keep to one hash slot on a cluster, and each request's
stream has a slot of its own, so a blocking XREAD cannot cover the streams a process
follows. Instead each node gets one pipelined round trip holding one non-blocking XREAD
per followed slot, repeated on a short interval that stretches while nothing arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

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


def plan_reads(
    cursors: Mapping[str, str], node_of: Callable[[str], Any], slot_of: Callable[[str], int]
) -> dict[str, NodeReads]:
    """The round's reads by node name (``node_of`` gives an object with ``.name``)."""
    plan: dict[str, NodeReads] = {}
    for key, cursor in cursors.items():
        node = node_of(key)
        reads = plan.setdefault(node.name, NodeReads(node))
        reads.by_slot.setdefault(slot_of(key), {})[key] = cursor
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
