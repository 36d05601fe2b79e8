"""renew.lua: extend the leases a worker still holds; renew_owned.lua: all of them, found
by the worker's id (the model's slot)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from shared.keys import Keys
from shared.scripts import ScriptCall


class RenewCode(IntEnum):
    LEASE_LOST = 0
    RENEWED = 1


@dataclass(frozen=True)
class Renew:
    """``held``: request id -> lease token."""

    tag: str
    held: Mapping[str, str]

    def call(self, keys: Keys, lease_ms: int) -> ScriptCall:
        pairs = [x for item in self.held.items() for x in item]
        return ScriptCall(
            "renew", [keys.leases(self.tag), keys.owners(self.tag)], [lease_ms, *pairs]
        )

    def parse(self, reply: Sequence[Any]) -> dict[str, RenewCode]:
        return {rid: RenewCode(int(c)) for rid, c in zip(self.held, reply, strict=True)}


@dataclass(frozen=True)
class RenewOwned:
    """Every lease whose token is ``worker_id``'s, without the worker's list of them."""

    tag: str
    worker_id: str

    def call(self, keys: Keys, lease_ms: int) -> ScriptCall:
        return ScriptCall(
            "renew_owned",
            [keys.leases(self.tag), keys.owners(self.tag)],
            [lease_ms, self.worker_id],
        )

    @staticmethod
    def parse(reply: Any) -> int:
        """How many leases were extended."""
        return int(reply)
