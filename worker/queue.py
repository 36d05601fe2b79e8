"""One model's queue in Redis as a worker sees it: the one owner of the worker's Redis
side. It holds the connection, its scripts, the key names, the model's tag and the
settings they need, and does what the loop and the heartbeat do there: read the queue,
claim, write steps, hand requests back, renew leases, reap, register the worker."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import NoScriptError

from shared.connection import UNREACHABLE, is_cluster, note_masters, refresh
from shared.errors import ReplicationTimeout
from shared.fairness import excess_tokens, units
from shared.flows import claim_flow, drive, fence_flow
from shared.keys import Keys, model_tag
from shared.loras import get_lora
from shared.models import FinalEvent, LoraAdapter, TokenEvent
from shared.ops.claim import AFFINITY_WINDOW, GUIDED_MARK, Claim, Claimed
from shared.ops.moves import Charge, FenceMode, Moved, Settle
from shared.ops.publish import Finish, Finished, Publish, Written
from shared.ops.renew import Renew, RenewCode
from shared.ops.warm import Warm
from shared.reaper import Reaped, reap_once
from shared.records import stream_event
from shared.registry import register_worker
from shared.replication import Confirm, Replicas, first_keys
from shared.replies import text
from shared.scripts import ScriptCall, Scripts
from shared.settings import Settings
from shared.usage import Used, record_call
from worker.held import Held
from worker.publisher import Planned, StepPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Beat:
    """What a heartbeat learned: each held lease's renewal, the requests whose cancel
    was asked for, and an operator's order to this worker ('drain'), if any."""

    renewed: dict[str, RenewCode] = field(default_factory=dict)
    cancelled: frozenset[str] = frozenset()
    order: str | None = None


@dataclass
class Peers:
    """The model's other live workers, as the last heartbeat learned them (warm.lua):
    written on the heartbeat's thread, read by the claims' (one attribute, swapped whole)."""

    ids: tuple[str, ...] = ()


class ModelQueue:
    """``worker_id``'s side of ``model``'s queue, on one connection (``sibling`` gives
    the same queue on another: the heartbeat's)."""

    def __init__(
        self,
        connection: redis.Redis,
        settings: Settings,
        model: str,
        worker_id: str,
        peers: Peers | None = None,
    ) -> None:
        self.redis = connection
        self.settings = settings
        self.model = model
        self.worker_id = worker_id
        self.keys = Keys(settings.namespace)
        self.tag = model_tag(model)
        self.scripts = Scripts(connection, Replicas.of(settings))
        self.cluster = is_cluster(connection)
        self.peers = Peers() if peers is None else peers
        # What ended in earlier writes, to settle on the model's slot with the next
        # (``write``). Touched only by the writes, which never overlap.
        self.unsettled: list[ScriptCall] = []

    def sibling(self, connection: redis.Redis) -> ModelQueue:
        return ModelQueue(connection, self.settings, self.model, self.worker_id, self.peers)

    def refresh(self) -> None:
        """After an error: on a cluster, read the slot map again (a failover)."""
        refresh(self.redis)

    def recovered(self) -> None:
        """Redis answers again after errors: say so if a cluster master changed."""
        note_masters(self.redis)

    # What the loop reads before it claims.

    def can_serve_queued(self, rank_limit: int, guided: bool = True) -> bool:
        """Whether the queue holds a request a worker serving adapters up to
        ``rank_limit`` (and structured outputs, with ``guided``) could claim: the others
        wait for a worker that serves them, so a burst run ends without them (claim.lua)."""
        queue = self.keys.queue(self.tag)
        num_queued = int(self.redis.zcard(queue))
        if not num_queued:
            return False
        marks = self.keys.lora_ranks(self.tag)
        beyond: list[Any] = self.redis.zrange(
            marks, f"({rank_limit}", f"({GUIDED_MARK}", byscore=True
        )
        guided_from = GUIDED_MARK + rank_limit if guided else GUIDED_MARK - 1
        beyond += self.redis.zrange(marks, f"({guided_from}", "+inf", byscore=True)
        if not beyond:
            return True
        scores: list[Any] = self.redis.zmscore(queue, beyond)
        return num_queued > sum(score is not None for score in scores)

    def wait_for_work(self, timeout_s: float) -> None:
        """Block until an enqueue wakes an idle worker, or ``timeout_s``."""
        self.redis.blpop([self.keys.wakeup(self.tag)], timeout=timeout_s)

    # Claims and hand-backs.

    def claim(
        self, room: int, free: int, max_lora_rank: int | None, guided: bool = True
    ) -> list[Claimed]:
        """Claim the queue's heads: resumed requests up to ``room``, new ones up to
        ``free`` in all (nothing while the queue is paused), those whose adapter the
        worker serves (``max_lora_rank``; None: any) and, without ``guided``, none that
        asks for structured outputs; with prefix affinity on, new requests whose prefix
        this worker holds warm first, within claim.lua's bounds."""
        lease_ms = self.settings.lease_ms
        window = AFFINITY_WINDOW if self.settings.prefix_affinity else 0
        max_wait_ms = self.settings.prefix_affinity_max_wait_ms
        claim = Claim(self.tag, self.worker_id, lease_ms, room, free, max_lora_rank,
                      guided=guided, affinity_window=window, max_pass_ms=max_wait_ms,
                      peers=self.peers.ids if window else ())  # fmt: skip
        return drive(self.scripts, claim_flow(self.keys, self.settings, claim, self.cluster))

    def release(self, held: Mapping[str, str]) -> list[Moved]:
        """Hand requests back (id -> lease token): they go back to the queue, ahead of
        new work when they published something, their attempt given back."""
        if not held:
            return []
        flow = fence_flow(self.keys, self.settings, self.tag, held, FenceMode.RELEASE)
        return drive(self.scripts, flow)

    def hand_back_cut(self, cut: Mapping[str, str]) -> None:
        """Requests whose streams lost their tail (a failover) go back to the queue ahead
        of new work, to resume from what Redis holds. Should this fail, their leases
        lapse and the reaper puts them back."""
        if not cut:
            return
        log.warning(
            "stream(s) of %s hold fewer tokens than were written (a Redis failover lost "
            "them): handed back, to resume from what Redis holds", ", ".join(cut)
        )  # fmt: skip
        try:
            self.release(cut)
        except (*UNREACHABLE, ReplicationTimeout) as e:
            log.warning("handing back failed (%s); their leases lapse instead", e)

    def published(self, request_id: str) -> list[TokenEvent]:
        """The token events earlier attempts published, in order."""
        entries: Any = self.redis.xrange(self.keys.stream(request_id))
        events = (stream_event(entry_id, fields).event for entry_id, fields in entries)
        return [e for e in events if isinstance(e, TokenEvent)]

    def lora(self, name: str) -> LoraAdapter | None:
        return get_lora(self.redis, self.keys, self.model, name)

    # Writes.

    def write(self, plan: StepPlan) -> list[tuple[Planned, Written]]:
        """One round trip for a write, which also settles what earlier writes ended
        (``publish``); what this one ends is settled by the next (or by ``settle``)."""
        written = self.publish(Publish(plan.events(self.cluster)), plan.ended)
        pairs = list(zip(plan.items, written, strict=True))
        self.settle_later(self._settle_calls([(p.held, w.finished) for p, w in pairs]))
        return pairs

    def publish(self, publish: Publish, ends: bool) -> list[Written]:
        """publish.lua's calls for a write, with the settling of what earlier writes
        ended in the same round trip (``ends``: the write ends requests)."""
        calls = publish.calls(self.keys, self.settings.result_ttl_s, self.cluster)
        if not calls:
            self.settle()
            return []
        # A final decides its request's fate: with replicas wanted, the write waits for them.
        confirm = Confirm(first_keys(calls), "a write that ends requests") if ends else None
        num_unsettled = len(self.unsettled)
        replies = self.scripts.send([*self.unsettled, *calls], confirm)  # reloads scripts if lost
        self.unsettled = []
        return publish.parse(replies[num_unsettled:])

    def settle_later(self, calls: list[ScriptCall]) -> None:
        """Settle on the next write's round trip (a round trip of its own costs Redis
        about as much CPU as the scripts of a short request's write)."""
        self.unsettled += calls

    def settle(self) -> None:
        """Settle what earlier writes ended, in a round trip of its own."""
        if self.unsettled:
            self.scripts.send(self.unsettled)
            self.unsettled = []

    def finish_now(self, held: Held, finish: Finish) -> Finished | None:
        """A final outside a write (a request that cannot run), settled at once: None
        if nothing was written (the lease lost). (It may run beside a write in flight,
        so it leaves ``unsettled`` to the writes.)"""
        call = finish.call(self.keys, self.settings.result_ttl_s)
        (reply,) = self.scripts.send([call], Confirm(call.keys, "a final"))
        finished = finish.parse(reply)
        settle = self._settle_calls([(held, finished)])
        if settle:
            self.scripts.send(settle)
        return finished

    def _settle_calls(self, ended: list[tuple[Held, Finished | None]]) -> list[ScriptCall]:
        """For requests whose final went through: on the model's slot drop their leases
        and charge their tenants' fair share what they used beyond the enqueue
        estimate; add their usage to their tenants' hour."""
        done = [(h, f) for h, f in ended if f is not None]
        if not done:
            return []
        finals = [(h, FinalEvent.model_validate_json(f.final_json)) for h, f in done]
        charges = [
            Charge(h.request.priority, h.request.tenant, units(n, h.request.tenant_weight))
            for h, final in finals
            if (n := excess_tokens(h.request, final.usage.prompt_tokens,
                                   final.usage.completion_tokens))
        ]  # fmt: skip
        used = [
            Used(h.request.tenant, final.usage, h.num_prefix_queried_tokens,
                 h.num_prefix_hit_tokens)
            for h, final in finals
        ]  # fmt: skip
        settle = Settle(self.tag, [f.moved for _, f in done], charges)
        return [settle.call(self.keys), record_call(self.keys, self.settings, used)]

    # The heartbeat's side.

    def beat(
        self, held: Mapping[str, str], fields: dict[str, Any], warm: Sequence[str] = ()
    ) -> Beat:
        """One round trip: renew the leases ``held`` (id -> token) on the model's slot,
        read their cancel flags on their own, refresh the registry entry (``fields``),
        publish the prefix fingerprints held ``warm`` (with prefix affinity on) and read
        an operator's order."""
        pipe = self.redis.pipeline(transaction=False)
        renew = Renew(self.tag, held)
        if self.settings.prefix_affinity:
            # Expires with the leases: a worker whose leases lapse is taken for dead.
            warm_call = Warm(self.tag, self.worker_id, warm).call(self.keys, self.settings.lease_ms)
            self.scripts.run(warm_call, pipe)
        if held:
            self.scripts.run(renew.call(self.keys, self.settings.lease_ms), pipe)
            for request_id in held:
                pipe.hget(self.keys.request(request_id), "cancel")
        register_worker(pipe, self.keys, self.settings, self.worker_id, fields)
        pipe.get(self.keys.worker_control(self.worker_id))
        try:
            replies = pipe.execute()
        except NoScriptError:  # Redis restarted without its scripts: load them; next beat
            self.scripts.reload()
            raise
        order = None if replies[-1] is None else text(replies[-1])
        if self.settings.prefix_affinity:
            self.peers.ids = tuple(Warm.parse(replies[0]).peers)
            replies = replies[1:]
        if not held:
            return Beat(order=order)
        flags = replies[1 : 1 + len(held)]
        cancelled = frozenset(i for i, flag in zip(held, flags, strict=True) if flag == b"1")
        return Beat(renew.parse(replies[0]), cancelled, order)

    def register(self, fields: dict[str, Any]) -> None:
        """The registry entry alone (while the model loads)."""
        pipe = self.redis.pipeline(transaction=False)
        register_worker(pipe, self.keys, self.settings, self.worker_id, fields)
        pipe.execute()

    def deregister(self) -> None:
        try:
            self.redis.delete(self.keys.worker(self.worker_id))
            self.redis.delete(self.keys.warm(self.tag, self.worker_id))
            self.redis.zrem(self.keys.warm_publishers(self.tag), self.worker_id)
            self.redis.zrem(self.keys.workers(), self.worker_id)
            self.redis.hdel(self.keys.limits(self.tag), self.worker_id)
        except redis.RedisError:
            pass  # the registry entry expires on its own

    def reap(self) -> Reaped | None:
        """One sweep for requests whose worker died (None: another process sweeps)."""
        return reap_once(self.redis, self.scripts, self.settings, self.tag, self.worker_id)
