"""All Redis key names, in one place.

Every key a script touches for a model carries that model's hash tag, so scripts
run on Redis Cluster too. A request id starts with its model's tag, so any
process can find a request's keys from its id alone.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from shared.errors import InvalidRequest

TAG_CHARS = 8
REQUEST_ID_RE = re.compile(r"^([0-9a-f]{8})-([0-9a-f]{24})$")


def model_tag(model: str) -> str:
    """A short stable tag for a model name (the Redis Cluster hash tag)."""
    return hashlib.sha1(model.encode()).hexdigest()[:TAG_CHARS]


def new_request_id(model: str) -> str:
    return f"{model_tag(model)}-{secrets.token_hex(12)}"


def tag_of(request_id: str) -> str:
    """The model tag of a request id; raises InvalidRequest for anything malformed."""
    match = REQUEST_ID_RE.match(request_id)
    if match is None:
        raise InvalidRequest(
            f"malformed request id {request_id!r}: expected 8 hex, '-', 24 hex characters"
        )
    return match.group(1)


@dataclass(frozen=True)
class Keys:
    namespace: str = "tokenq"

    def _q(self, tag: str, name: str) -> str:
        return f"{self.namespace}:{{{tag}}}:{name}"

    # Per model queue (all share the tag).
    def queue(self, tag: str) -> str:
        return self._q(tag, "queue")

    def seq(self, tag: str) -> str:
        return self._q(tag, "seq")

    def leases(self, tag: str) -> str:
        return self._q(tag, "leases")

    def owners(self, tag: str) -> str:
        return self._q(tag, "owners")

    def dead(self, tag: str) -> str:
        return self._q(tag, "dead")

    def wakeup(self, tag: str) -> str:
        return self._q(tag, "wakeup")

    def recent(self, tag: str) -> str:
        """Ended requests by end time (bounded; see _lib.lua)."""
        return self._q(tag, "recent")

    def failed(self, tag: str) -> str:
        """Failed and dead-lettered requests by end time (bounded)."""
        return self._q(tag, "failed")

    def deadlines(self, tag: str) -> str:
        return self._q(tag, "deadlines")

    def served(self, tag: str) -> str:
        """Present while some worker has served the model recently (see enqueue.lua)."""
        return self._q(tag, "served")

    def reaper_lock(self, tag: str) -> str:
        return self._q(tag, "reaper")

    def paused(self, tag: str) -> str:
        return self._q(tag, "paused")

    def idempotency(self, tag: str, key: str, tenant: str | None = None) -> str:
        """Per tenant: one tenant's key never finds another tenant's request."""
        scoped = key if tenant is None else f"{tenant}\x00{key}"
        digest = hashlib.sha256(scoped.encode()).hexdigest()
        return self._q(tag, f"idem:{digest}")

    # Per request (tag taken from the id).
    def request(self, request_id: str) -> str:
        return self._q(tag_of(request_id), f"req:{request_id}")

    def stream(self, request_id: str) -> str:
        return self._q(tag_of(request_id), f"stream:{request_id}")

    # Global, never touched by a script together with tagged keys.
    def models(self) -> str:
        return f"{self.namespace}:models"

    def workers(self) -> str:
        return f"{self.namespace}:workers"

    def worker(self, worker_id: str) -> str:
        return f"{self.namespace}:worker:{worker_id}"

    def worker_control(self, worker_id: str) -> str:
        """An operator's order to a worker ('drain'), read on its heartbeat."""
        return f"{self.namespace}:worker:{worker_id}:control"

    def lifecycle_channel(self) -> str:
        return f"{self.namespace}:lifecycle"

    def dashboard_history(self) -> str:
        """A stream of dashboard snapshots (one field 's' = json), capped with MAXLEN."""
        return f"{self.namespace}:dashboard:history"

    def dashboard_sampler_lock(self) -> str:
        """Held (SET NX PX) by the gateway taking the next dashboard snapshot."""
        return f"{self.namespace}:dashboard:sampler"


# Batches and webhooks (RQ). A batch's keys share one hash tag (the batch id), so a
# MULTI over them also works on Redis Cluster.
BATCH_ID_RE = re.compile(r"^batch_[0-9a-f]{24}$")
DELIVERY_ID_RE = re.compile(r"^[A-Za-z0-9_\-]{1,80}$")


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def check_batch_id(batch_id: str) -> str:
    """The id itself; raises InvalidRequest for anything that is not a batch id."""
    if not BATCH_ID_RE.match(batch_id):
        raise InvalidRequest(
            f"malformed batch id {batch_id!r}: expected 'batch_' and 24 hex characters"
        )
    return batch_id


def check_delivery_id(delivery_id: str) -> str:
    if not DELIVERY_ID_RE.match(delivery_id):
        raise InvalidRequest(f"malformed webhook delivery id {delivery_id!r}")
    return delivery_id


@dataclass(frozen=True)
class BatchKeys:
    namespace: str = "tokenq"

    def _b(self, batch_id: str, name: str) -> str:
        return f"{self.namespace}:{{{check_batch_id(batch_id)}}}:batch:{name}"

    def meta(self, batch_id: str) -> str:
        """Hash: the batch record (state, cursor, driver job, ...)."""
        return self._b(batch_id, "meta")

    def lines(self, batch_id: str) -> str:
        """List: one validated line per input line, in input order."""
        return self._b(batch_id, "lines")

    def pending(self, batch_id: str) -> str:
        """Hash custom_id -> request id, for lines in tokenq's queue or running."""
        return self._b(batch_id, "pending")

    def outputs(self, batch_id: str) -> str:
        """Hash custom_id -> output JSONL line."""
        return self._b(batch_id, "outputs")

    def errors(self, batch_id: str) -> str:
        """Hash custom_id -> error JSONL line."""
        return self._b(batch_id, "errors")

    def all_of(self, batch_id: str) -> list[str]:
        names = (self.meta, self.lines, self.pending, self.outputs, self.errors)
        return [name(batch_id) for name in names]

    def batches(self) -> str:
        """Sorted set of batch ids by creation time (ms), for listing."""
        return f"{self.namespace}:batches"

    def delivery(self, delivery_id: str) -> str:
        """Hash: one webhook delivery (url, body, state, attempts, last error)."""
        return f"{self.namespace}:webhook:{check_delivery_id(delivery_id)}"

    def deliveries(self) -> str:
        """Sorted set of delivery ids by creation time (ms)."""
        return f"{self.namespace}:webhooks"

    def failed_deliveries(self) -> str:
        """Sorted set of deliveries whose retries ran out, by time of the last try."""
        return f"{self.namespace}:webhooks:failed"

    def watched(self) -> str:
        """Hash request id -> webhook URL: requests whose end the watcher reports."""
        return f"{self.namespace}:webhooks:watched"

    def watcher(self) -> str:
        """Hash with field ``driver``: the RQ job id of the live request watcher."""
        return f"{self.namespace}:webhooks:watcher"

    # RQ queues (RQ prefixes its own keys with ``rq:``).
    def batch_queue(self) -> str:
        return f"{self.namespace}-batch"

    def webhook_queue(self) -> str:
        return f"{self.namespace}-webhooks"
