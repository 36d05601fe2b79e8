"""Turning what engine steps produced into a write, and its replies into actions
(``worker.coalesce`` decides when: every step, or once per window; ``worker.queue``
sends it).

A write is its token events (one publish call on one Redis, one per slot on a
cluster) followed by a finish per request that ended, all on the requests' own slots.
Nothing about a request changes until Redis has acknowledged the write, so a write
that failed (Redis away) is simply sent again; the publish script's index check makes
that exactly-once. When requests ended, a second round trip settles them on the
model's slot (drops their leases, files them in history); should it never happen,
their leases lapse and the reaper settles them.

The worker sends a write from a thread of its own while the engine computes the next
step (``WorkerService.step``), and applies the replies on the loop's thread once that
step is done: a lease lost or a cancel seen in them reaches the engine one step later
than the write, and at most one write is in flight.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum

from shared.models import FinishReason
from shared.ops.moves import Fate
from shared.ops.publish import Final, Finish, PublishCode, TokenPublish, Written, slot_of
from shared.refusal import Refusal
from worker.coalesce import step_wire
from worker.engine.outputs import RequestOutput
from worker.held import STATE_OF_REASON, Held

log = logging.getLogger(__name__)


class Action(Enum):
    """What the loop does with a request once its write was acknowledged."""

    OK = "ok"
    CANCEL = "cancel"  # published; a cancel was asked for: stop it
    DROP = "drop"  # lease lost: another worker holds it now
    # Its stream holds fewer tokens than were written (a failover lost its tail): hand it
    # back, so it resumes at once from what Redis holds (re-publishing what was lost).
    RESYNC = "resync"
    DONE = "done"  # its final went through


@dataclass(frozen=True, slots=True)
class Planned:
    """One request's part of a write: its tokens (if any) and its final (if it ended)."""

    held: Held
    output: RequestOutput
    final: Final | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.output.new_token_ids)

    def event(self) -> TokenPublish:
        """Its part of publish.lua's call; a final is written once the stream holds
        every token the worker counts (what it recorded and this write's)."""
        out, held = self.output, self.held
        if not (out.new_token_ids or out.text):
            return TokenPublish(
                held.request_id, held.lease_token, b"", len(held.token_ids), 0, self.final
            )
        return TokenPublish(
            held.request_id, held.lease_token, step_wire(out), out.index, self.num_tokens,
            self.final,
        )  # fmt: skip


@dataclass
class StepPlan:
    """What a write sends: one item per request, each reply about its item."""

    items: list[Planned] = field(default_factory=list)

    def events(self, cluster: bool) -> list[TokenPublish]:
        """The items' events, in the order of ``items`` (on a cluster sorted by slot
        first, so one publish call serves each slot: ``shared.ops.slots``)."""
        if cluster:
            self.items.sort(key=lambda p: slot_of(p.held.request_id))
        return [self._event(at) for at in range(len(self.items))]

    def _event(self, at: int) -> TokenPublish:
        """Item ``at``'s event; one that cannot be written (say, text that is not
        valid UTF-8) becomes its request's error final, and the write goes on."""
        planned = self.items[at]
        try:
            return planned.event()
        except Exception as e:
            log.warning("request %s: its output cannot be written: %r", planned.held.request_id, e)
            self.items[at] = failed(
                planned, f"internal error: its output could not be written: {e!r}"
            )
            return self.items[at].event()

    @property
    def ended(self) -> bool:
        return any(p.final is not None for p in self.items)


def token_publish(held: Held, out: RequestOutput) -> TokenPublish:
    """The stream entry of ``out``: one step's tokens, or several steps' coalesced."""
    return Planned(held, out).event()


def final_of(
    held: Held,
    reason: FinishReason,
    more: RequestOutput | None = None,
    error: str | None = None,
    state: Fate | None = None,
) -> Final:
    """The final of ``held``, counting ``more`` (this write's tokens) in."""
    ids, text = (more.new_token_ids, more.text) if more is not None else ([], "")
    embedding = more.embedding if more is not None else None
    scores = more.prompt_logprobs if more is not None else None
    stop = more.stop_sequence if more is not None else None
    refusal = more.refusal if more is not None else None
    final = held.final(reason, len(ids), error, embedding, scores, stop, refusal)
    return Final.of(final, held.output_json(ids, text), _fate(reason, state))


def finish_of(
    held: Held,
    reason: FinishReason,
    error: str,
    state: Fate | None,
    num_published: int | None,
    refusal: Refusal | None = None,
) -> Finish:
    """A final outside a write (a request that cannot run), once its stream holds
    ``num_published`` tokens (None: whatever it holds)."""
    final = held.final(reason, error=error, refusal=refusal)
    return Finish(held.request_id, held.lease_token, final, held.output_json(),
                  _fate(reason, state), num_published)  # fmt: skip


def _fate(reason: FinishReason, state: Fate | None) -> Fate:
    """The terminal state a request ends in: ``state`` if given, else its reason's."""
    return state or Fate(STATE_OF_REASON[reason].value)


def failed(planned: Planned, error: str) -> Planned:
    """``planned`` as its request's error final, with none of its unwritten tokens."""
    out, held = planned.output, planned.held
    index = len(held.token_ids)
    void = RequestOutput(
        out.request_id, index, [], "", FinishReason.ERROR, None, out.num_prompt_tokens, index,
        error,
    )  # fmt: skip
    return Planned(held, void, final_of(held, FinishReason.ERROR, void, error=error))


def plan_step(held: dict[str, Held], outputs: list[RequestOutput]) -> StepPlan:
    plan = StepPlan()
    for out in outputs:
        h = held.get(out.request_id)
        if h is None:
            continue  # dropped (lease lost): its final output is not ours to publish
        final = None
        if out.finish_reason is not None:
            final = final_of(h, out.finish_reason, out, error=out.error)
        if final is not None or out.new_token_ids or out.text:
            plan.items.append(Planned(h, out, final))
    return plan


def settle(planned: Planned, written: Written) -> Action:
    """Apply an acknowledged reply to the worker's record, and say what to do next."""
    code = written.code
    if code is PublishCode.LEASE_LOST:
        return Action.DROP
    if code is PublishCode.GAP:
        return Action.RESYNC
    planned.held.record(planned.output.new_token_ids, planned.output.text)
    if code is PublishCode.FINISHED:
        return Action.DONE
    return Action.CANCEL if code is PublishCode.CANCEL_REQUESTED else Action.OK
