"""All Redis key names, in one place.

Two kinds of hash tag, so that every script touches one slot and runs on Redis
Cluster. A model's control keys (queue, leases, owners, ...) carry the model's tag
and are touched at enqueue, claim, renew, finish and reap. A request's own keys
(hash, stream, idempotency key) carry the request's tag, part of its random id, so
they spread over the slots and take the per-token traffic off the model's shard.

A request id is ``<model tag>-<request tag><8 more hex>``: any process finds both
the model's keys and the request's from the id alone.

Request tags fall on NUM_REQUEST_SLOTS hash slots spread evenly over the 16,384 (a
random 11-hex head, then 5 hex chosen so that the tag lands on the slot: CRC16 is
linear, so ``slot_tag`` finds them with a lookup or two). Why bounded: on a cluster a reader
sends one XREAD per slot it follows each round (XREAD keys must share a slot), so with
a slot per request its reads grow with the streams it follows; with NUM_REQUEST_SLOTS
it takes at most that many in all, however many streams are followed, and a worker's
publish calls group by slot the same way. Why evenly spread:
masters own contiguous slot ranges, so every master owns about the same number of
them (96 slots: 32 on each of 3 masters, 16 of 6) and takes its share of the token
traffic. Ids from before (a tag on any slot) keep working: every key is derived from
the id, never from this set.
"""

from __future__ import annotations

import binascii
import hashlib
import re
import secrets
from dataclasses import dataclass
from functools import cache

from shared.errors import InvalidRequest

TAG_CHARS = 8
REQUEST_TAG_CHARS = 16
REQUEST_ID_RE = re.compile(r"^([0-9a-f]{8})-([0-9a-f]{16})([0-9a-f]{8})$")
NUM_SLOTS = 16_384
NUM_REQUEST_SLOTS = 96
REQUEST_SLOTS = tuple(i * NUM_SLOTS // NUM_REQUEST_SLOTS for i in range(NUM_REQUEST_SLOTS))
SUFFIX_CHARS = 4  # the end of a request tag that, with the hex digit before it, picks its slot
HEAD_CHARS = REQUEST_TAG_CHARS - SUFFIX_CHARS - 1  # the random (or digest) start of a tag


def model_tag(model: str) -> str:
    """A short stable tag for a model name (the Redis Cluster hash tag)."""
    return hashlib.sha1(model.encode()).hexdigest()[:TAG_CHARS]


def new_request_id(model: str, request_tag: str | None = None) -> str:
    """A fresh id; ``request_tag`` (``idempotency_tag``) puts it on that slot, else it
    goes on one of the REQUEST_SLOTS at random."""
    head = secrets.token_hex(6)[:HEAD_CHARS]
    rtag = request_tag or slot_tag(head, secrets.choice(REQUEST_SLOTS))
    return f"{model_tag(model)}-{rtag}{secrets.token_hex(4)}"


def idempotency_digest(model: str, key: str, tenant: str | None = None) -> str:
    """Per model and tenant: one tenant's key never finds another tenant's request."""
    return hashlib.sha256("\x00".join((model, tenant or "", key)).encode()).hexdigest()


def idempotency_tag(digest: str) -> str:
    """The request tag of the request submitted with idempotency digest ``digest`` (hex),
    on one of the REQUEST_SLOTS: the same tag for the same digest, in every process."""
    slot = REQUEST_SLOTS[int(digest[HEAD_CHARS:REQUEST_TAG_CHARS], 16) % NUM_REQUEST_SLOTS]
    return slot_tag(digest[:HEAD_CHARS], slot)


def legacy_idempotency_tag(digest: str) -> str:
    """Where producers before the bounded slots kept a digest's key (its first 16 hex)."""
    return digest[:REQUEST_TAG_CHARS]


def slot_tag(head: str, slot: int) -> str:
    """``head`` (11 hex) and 5 hex more: a hash tag on ``slot``. Redis's CRC16 (XMODEM)
    is linear: CRC(head + c + suffix) = CRC(head + c + 4 zero bytes) ^ CRC(suffix), and
    4-hex suffixes reach 80% of the slots' 14 bits, so the first ``c`` (a hex digit)
    whose lookup hits gives the tag (the same for the same head and slot)."""
    for c in "0123456789abcdef":
        base = binascii.crc_hqx(f"{head}{c}".encode() + b"\0" * SUFFIX_CHARS, 0)
        suffix = _suffixes().get((base ^ slot) % NUM_SLOTS)
        if suffix is not None:
            return f"{head}{c}{suffix}"
    raise ValueError(f"no request tag on slot {slot} starts with {head!r}")  # not seen


@cache
def _suffixes() -> dict[int, str]:
    """The low 14 bits of CRC16 -> a 4-hex string with them (for 80% of the values)."""
    table: dict[int, str] = {}
    for n in range(16**SUFFIX_CHARS):
        suffix = f"{n:0{SUFFIX_CHARS}x}"
        table.setdefault(binascii.crc_hqx(suffix.encode(), 0) % NUM_SLOTS, suffix)
    return table


def _match(request_id: str) -> re.Match[str]:
    match = REQUEST_ID_RE.match(request_id)
    if match is None:
        raise InvalidRequest(
            f"malformed request id {request_id!r}: expected 8 hex, '-', 24 hex characters"
        )
    return match


def tag_of(request_id: str) -> str:
    """The model tag of a request id; raises InvalidRequest for anything malformed."""
    return _match(request_id).group(1)


def request_tag(request_id: str) -> str:
    """The request's own hash tag; raises InvalidRequest for anything malformed."""
    return _match(request_id).group(2)


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

    def load_failure(self, tag: str) -> str:
        """Why the model's last worker could not load it (a line), while no worker serves
        it: enqueue.lua refuses requests for it with that reason."""
        return self._q(tag, "load_failure")

    def limits(self, tag: str) -> str:
        """Hash worker id -> ModelLimits json: what each of the model's workers can take
        (shared.limits; a submit refuses what none would run)."""
        return self._q(tag, "limits")

    def guided_served(self, tag: str) -> str:
        """Present while a live worker of the model serves structured outputs (its grammar
        backend works): enqueue.lua refuses structured requests without it."""
        return self._q(tag, "guided_served")

    def reaper_lock(self, tag: str) -> str:
        return self._q(tag, "reaper")

    def paused(self, tag: str) -> str:
        return self._q(tag, "paused")

    def loras(self, tag: str) -> str:
        """Hash adapter name -> LoraAdapter json: the LoRA adapters registered for the
        model (enqueue.lua refuses a request naming another)."""
        return self._q(tag, "loras")

    def lora_ranks(self, tag: str) -> str:
        """Zset id -> adapter rank of the model's requests with a LoRA adapter, from
        enqueue until they end (kept while dead-lettered): claim.lua leaves a worker the
        ones it cannot serve. A request without an entry is a base request."""
        return self._q(tag, "lora_ranks")

    def prefixes(self, tag: str) -> str:
        """Hash id -> the queued request's prefix fingerprints, space-separated, shortest
        cut first (shared/prefixes.py), from enqueue until claimed or ended."""
        return self._q(tag, "prefixes")

    def passes(self, tag: str) -> str:
        """Hash id -> '<claims>:<first ms>': how often, since when, claims passed the
        queued request over for a warm match (claim.lua bounds both)."""
        return self._q(tag, "passes")

    def warm(self, tag: str, worker_id: str) -> str:
        """Set of the fingerprints ``worker_id`` holds in its prefix cache (warm.lua),
        expiring with its heartbeat."""
        return self._q(tag, f"warm:{worker_id}")

    def warm_publishers(self, tag: str) -> str:
        """Zset worker id -> when its warm set expires (ms): the model's workers that
        publish one, so that each learns its peers' sets (warm.lua)."""
        return self._q(tag, "warm-publishers")

    def scores(self, tag: str) -> str:
        """Hash id -> the queue score a claimed request goes back to if put back."""
        return self._q(tag, "scores")

    def fair_clock(self, tag: str) -> str:
        """Hash priority -> the band's virtual time (shared.fairness)."""
        return self._q(tag, "fair:clock")

    def fair_tags(self, tag: str) -> str:
        """Zset '<priority>:<tenant>' -> band base + the tenant's virtual finish time."""
        return self._q(tag, "fair:tags")

    # Per API key (or client tenant) rate limits: their own tag, one slot per bucket.
    def rate_limit(self, bucket: str, name: str) -> str:
        """``name`` is 'requests' or 'tokens' (GCRA times) or 'inflight' (zset)."""
        return self._q(f"rl-{bucket}", name)

    # Per request (the request's own tag, taken from the id or the idempotency digest).
    def idempotency(self, digest: str) -> str:
        """Holds the id of the request submitted with that key (``idempotency_digest``);
        on the slot of that request, whose id carries ``idempotency_tag(digest)``."""
        return self._q(idempotency_tag(digest), f"idem:{digest}")

    def idempotency_body(self, digest: str) -> str:
        """The body digest (``shared.idempotency``) of the request that key names, on
        the key's slot: a key reused with another body is refused (admit.lua)."""
        return self._q(idempotency_tag(digest), f"idem-body:{digest}")

    def legacy_idempotency(self, digest: str) -> str:
        """Where producers before the bounded request slots kept the same key."""
        return self._q(legacy_idempotency_tag(digest), f"idem:{digest}")

    def no_idempotency(self, request_id: str) -> str:
        """A name on the request's slot that the scripts never write: admit.lua's KEYS
        slot for a request submitted without an idempotency key."""
        return self._q(request_tag(request_id), "idem:-")

    def request(self, request_id: str) -> str:
        return self._q(request_tag(request_id), f"req:{request_id}")

    def stream(self, request_id: str) -> str:
        return self._q(request_tag(request_id), f"stream:{request_id}")

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

    def usage(self, hour: int) -> str:
        """Hash '<prompt|completion|requests>:<tenant>' -> count, for one UTC hour
        (hours since the epoch); expires after the usage retention."""
        return f"{self.namespace}:usage:{hour}"

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


FILE_ID_RE = re.compile(r"^file-[0-9a-f]{24}$")


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def derived_file_id(owner: str, part: str) -> str:
    """The same id every time for one object's ``part`` (a batch's output file), so
    the step that records it can be repeated."""
    return f"file-{hashlib.sha256(f'{owner}:{part}'.encode()).hexdigest()[:24]}"


def is_file_id(file_id: str) -> bool:
    return FILE_ID_RE.match(file_id) is not None


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
        """Hash custom_id -> ``<kind>:<request ids, one per choice>:<line index>:<n>``,
        for lines in tokenq's queue or running."""
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


@dataclass(frozen=True)
class FileKeys:
    """Files (``/v1/files``), on the batches' Redis. A file's keys share its id as tag."""

    namespace: str = "tokenq"

    def meta(self, file_id: str) -> str:
        """Hash: the file object (purpose, filename, bytes, owner, ...)."""
        return f"{self.namespace}:{{{file_id}}}:file:meta"

    def data(self, file_id: str) -> str:
        """List: the file's bytes in chunks, in order (absent for a batch's output file,
        which is read from the batch)."""
        return f"{self.namespace}:{{{file_id}}}:file:data"

    def owned(self, tenant: str) -> str:
        """Sorted set of a tenant's file ids by creation time (ms), for listing."""
        return f"{self.namespace}:files:{tenant}"
