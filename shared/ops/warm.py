"""warm.lua: publish the prefix fingerprints a worker holds warm (the model's slot)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.keys import Keys
from shared.replies import text
from shared.scripts import ScriptCall

# Fingerprints a worker publishes, its newest: enough for the prefixes a KV cache holds
# at once, few enough that a heartbeat stays one small write.
MAX_WARM = 64
# Peers whose warm sets a claim reads (the most recently renewed): a claim leaves a
# request warm on one of them to it, within the pass-over bound (claim.lua).
MAX_PEERS = 16


@dataclass(frozen=True)
class WarmReply:
    num_kept: int  # fingerprints the set holds now
    peers: list[str]  # the model's other workers that publish a warm set, newest first


@dataclass(frozen=True)
class Warm:
    """Replace ``worker_id``'s warm set with ``fingerprints`` (newest first, at most
    MAX_WARM kept), to expire after ``ttl_ms`` unless the next heartbeat renews it."""

    tag: str
    worker_id: str
    fingerprints: Sequence[str]

    def call(self, keys: Keys, ttl_ms: int) -> ScriptCall:
        return ScriptCall(
            "warm",
            [keys.warm(self.tag, self.worker_id), keys.warm_publishers(self.tag)],
            [ttl_ms, self.worker_id, MAX_PEERS, *self.fingerprints[:MAX_WARM]],
        )

    @staticmethod
    def parse(reply: Any) -> WarmReply:
        num_kept, peers = reply
        return WarmReply(int(num_kept), [text(p) for p in peers])
