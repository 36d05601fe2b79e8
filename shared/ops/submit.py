"""admit.lua (the request's slot), enqueue.lua (the model's slot) and withdraw.lua:
the steps of a submit (``shared.flows.enqueue_flow`` orders them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.cache_scope import cache_salt
from shared.fairness import estimated_tokens, fair_member, units
from shared.idempotency import body_digest
from shared.keys import Keys, model_tag
from shared.models import GenerationRequest, dumps
from shared.ops.claim import GUIDED_MARK
from shared.prefixes import fingerprints
from shared.replies import text
from shared.scripts import ScriptCall
from shared.settings import Settings


def idempotency_keys(keys: Keys, request_id: str, digest: str | None) -> list[str]:
    """The request's idempotency key and the key that holds its body's digest; without
    one, a name on the request's slot that the scripts never write (KEYS must name them
    all the same)."""
    if not digest:
        return [keys.no_idempotency(request_id)] * 2
    return [keys.idempotency(digest), keys.idempotency_body(digest)]


class AdmitOutcome(StrEnum):
    OK = "ok"
    DUPLICATE = "duplicate"  # its idempotency key names an earlier request
    # ... an earlier request with another body (shared.idempotency): refused
    KEY_REUSED = "idempotency_key_reused"


@dataclass(frozen=True)
class Admitted:
    outcome: AdmitOutcome
    request_id: str  # the new id, or the earlier request's


@dataclass(frozen=True)
class Admit:
    """admit.lua: write the request hash (and its idempotency key, with the body's
    digest), or find the request its idempotency key names."""

    request_id: str
    request: GenerationRequest
    digest: str | None

    def call(self, keys: Keys, settings: Settings) -> ScriptCall:
        req, rid = self.request, self.request_id
        return ScriptCall(
            "admit",
            [keys.request(rid), *idempotency_keys(keys, rid, self.digest)],
            [
                rid,
                dumps(req).decode(),
                "" if self.digest is None else "1",
                settings.idempotency_ttl_s,
                req.model,
                int(req.priority),
                "" if req.deadline_ms is None else req.deadline_ms,
                req.tenant or "",
                "" if self.digest is None else body_digest(req),
            ],
        )

    @staticmethod
    def parse(reply: Sequence[Any]) -> Admitted:
        return Admitted(AdmitOutcome(text(reply[0])), text(reply[1]))


class EnqueueOutcome(StrEnum):
    OK = "ok"
    FULL = "full"
    UNKNOWN_MODEL = "unknown_model"
    UNKNOWN_LORA = "unknown_lora"
    UNLOADABLE = "unloadable"  # no worker serves it, and the last one could not load it
    # It asks for structured outputs, and no live worker of its model serves them.
    NO_CAPABILITY = "no_capability"


@dataclass(frozen=True)
class Queued:
    outcome: EnqueueOutcome
    reason: str = ""  # with UNLOADABLE: why the model's last worker could not load it


@dataclass(frozen=True)
class Enqueue:
    """enqueue.lua: put an admitted request in its model's queue (idempotent)."""

    request_id: str
    request: GenerationRequest

    def call(self, keys: Keys, settings: Settings) -> ScriptCall:
        req, tag = self.request, model_tag(self.request.model)
        return ScriptCall(
            "enqueue",
            [
                keys.queue(tag),
                keys.seq(tag),
                keys.wakeup(tag),
                keys.deadlines(tag),
                keys.served(tag),
                keys.owners(tag),
                keys.fair_clock(tag),
                keys.fair_tags(tag),
                keys.loras(tag),
                keys.lora_ranks(tag),
                keys.load_failure(tag),
                keys.guided_served(tag),
                keys.prefixes(tag),
            ],
            [
                self.request_id,
                int(req.priority),
                settings.max_queued,
                "" if req.deadline_ms is None else req.deadline_ms,
                req.model,
                keys.lifecycle_channel(),
                "1" if settings.require_known_model else "0",
                fair_member(req.priority, req.tenant),
                units(estimated_tokens(req), req.tenant_weight),
                req.lora or "",
                GUIDED_MARK if req.sampling.guided else 0,
                " ".join(fingerprints(req, cache_salt(req, settings))),
            ],
        )

    @staticmethod
    def parse(reply: Sequence[Any]) -> Queued:
        outcome = EnqueueOutcome(text(reply[0]))
        with_reason = (EnqueueOutcome.UNLOADABLE, EnqueueOutcome.NO_CAPABILITY)
        reason = text(reply[1]) if outcome in with_reason else ""
        return Queued(outcome, reason)


@dataclass(frozen=True)
class Withdraw:
    """withdraw.lua: remove an admitted request its queue refused, unless it moved on."""

    request_id: str
    digest: str | None

    def call(self, keys: Keys) -> ScriptCall:
        rid = self.request_id
        return ScriptCall(
            "withdraw", [keys.request(rid), *idempotency_keys(keys, rid, self.digest)], [rid]
        )

    @staticmethod
    def parse(reply: Any) -> bool:
        """Whether it was removed (False: it had already run)."""
        return bool(int(reply))
