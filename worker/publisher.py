"""Turning what engine steps produced into one pipelined round trip, and its replies
into actions (``worker.coalesce`` decides when: every step, or once per window).

A write is its token events (one publish call on one Redis, one per request on a
cluster) followed by a finish call per request that ended, all on the requests' own
slots. Nothing about a request changes until Redis has acknowledged the round trip,
so a step whose publish failed (Redis away) is simply sent again; the publish
script's index check makes that exactly-once. When requests ended, a second round
trip settles them on the model's slot (drops their leases, files them in history);
should it never happen, their leases lapse and the reaper settles them.

The worker sends a write from a thread of its own while the engine computes the next
step (``WorkerService.step``), and applies the replies on the loop's thread once that
step is done: a lease lost or a cancel seen in them reaches the engine one step later
than the write, and at most one write is in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.calls import (
    TokenPublish,
    charge_call,
    finish_call,
    parse_finish,
    publish_calls,
    settle_call,
    slot_of,
)
from shared.connection import is_cluster
from shared.fairness import excess_tokens, units
from shared.keys import Keys
from shared.models import FinalEvent, FinishReason, dumps
from shared.scripts import ScriptCall, Scripts
from shared.settings import Settings
from shared.usage import record_call
from worker.coalesce import step_wire
from worker.engine.outputs import RequestOutput
from worker.held import STATE_OF_REASON, Held

# publish.lua's codes per event (1, published, needs no action).
LEASE_LOST, CANCEL_REQUESTED, GAP = 0, 2, 3


@dataclass(frozen=True, slots=True)
class Planned:
    held: Held
    output: RequestOutput
    is_finish: bool


@dataclass
class StepPlan:
    """What a step sends, and which request each reply is about."""

    tokens: list[Planned] = field(default_factory=list)
    finishes: list[Planned] = field(default_factory=list)
    finish_calls: list[ScriptCall] = field(default_factory=list)

    def calls(self, keys: Keys, cluster: bool) -> list[ScriptCall]:
        if cluster:  # one publish call per slot, not per request (publish_calls)
            self.tokens.sort(key=lambda p: slot_of(p.held.request_id))
        events = [token_publish(p.held, p.output) for p in self.tokens]
        return [*publish_calls(keys, events, cluster), *self.finish_calls]

    def pair(self, replies: list[Any]) -> list[tuple[Planned, Any]]:
        """Each planned item with its reply: a publish code, or a finish reply."""
        num_publish = len(replies) - len(self.finishes)
        codes = [code for reply in replies[:num_publish] for code in reply]
        return [
            *zip(self.tokens, codes, strict=True),
            *zip(self.finishes, replies[num_publish:], strict=True),
        ]


def send_step(
    connection: Any, scripts: Scripts, keys: Keys, settings: Settings, tag: str, plan: StepPlan
) -> list[tuple[Planned, Any]]:
    """One round trip for the step, and one more to settle what ended in it. A finish
    pairs with its final event's json, or LEASE_LOST."""
    calls = plan.calls(keys, is_cluster(connection))
    if not calls:
        return []
    pairs = plan.pair(scripts.send(calls))  # reloads the scripts after a Redis restart
    finished = [(p.held, r) for p, r in pairs if p.is_finish]
    settle_ended(scripts, keys, settings, tag, finished)
    return [(p, _final_of(r) if p.is_finish else r) for p, r in pairs]


def finish_now(
    scripts: Scripts, keys: Keys, settings: Settings, tag: str, held: Held, call: ScriptCall
) -> Any:
    """A finish outside a step: its reply as ``send_step`` pairs it."""
    reply = scripts.run(call)
    settle_ended(scripts, keys, settings, tag, [(held, reply)])
    return _final_of(reply)


def settle_ended(
    scripts: Scripts, keys: Keys, settings: Settings, tag: str, finished: list[tuple[Held, Any]]
) -> None:
    """For requests whose finish went through, in one round trip on the model's slot:
    drop their leases, charge their tenants' fair share what they used beyond the
    enqueue estimate; and add their usage to their tenants' hour."""
    done = [(h, r) for h, r in finished if parse_finish(r, h.request_id, h.lease_token)]
    if not done:
        return
    moved = [parse_finish(r, h.request_id, h.lease_token) for h, r in done]
    finals = [(h, FinalEvent.model_validate_json(r[0])) for h, r in done]
    charges = [
        (h.request.priority, h.request.tenant, units(n, h.request.weight))
        for h, final in finals
        if (n := excess_tokens(h.request, final.usage.prompt_tokens, final.usage.completion_tokens))
    ]
    used = [(h.request.tenant, final.usage) for h, final in finals]
    calls = [settle_call(keys, tag, [m for m in moved if m is not None])]
    if charges:
        calls.append(charge_call(keys, tag, charges))
    scripts.send([*calls, record_call(keys, settings, used)])


def _final_of(reply: Any) -> Any:
    return reply[0] if isinstance(reply, list) else LEASE_LOST


def token_publish(held: Held, out: RequestOutput) -> TokenPublish:
    """The stream entry of ``out``: one step's tokens, or several steps' coalesced."""
    return TokenPublish(
        held.request_id, held.lease_token, step_wire(out), out.index, len(out.new_token_ids)
    )


def end_call(
    keys: Keys,
    settings: Settings,
    held: Held,
    reason: FinishReason,
    more: RequestOutput | None = None,
    error: str | None = None,
    state: str | None = None,
) -> ScriptCall:
    """The finish script for ``held``, counting ``more`` (this step's tokens) in."""
    ids, text = (more.new_token_ids, more.text) if more is not None else ([], "")
    embedding = more.embedding if more is not None else None
    final = held.final(reason, len(ids), error, embedding)
    output = held.output_json(ids, text)
    state = state or STATE_OF_REASON[reason].value
    return finish_call(
        keys, settings, held.request_id, held.lease_token, dumps(final), output, state
    )


def plan_step(
    keys: Keys, settings: Settings, held: dict[str, Held], outputs: list[RequestOutput]
) -> StepPlan:
    plan = StepPlan()
    for out in outputs:
        h = held.get(out.request_id)
        if h is None:
            continue  # dropped (lease lost): its final output is not ours to publish
        if out.new_token_ids or out.text:
            plan.tokens.append(Planned(h, out, is_finish=False))
        if out.finish_reason is not None:
            plan.finishes.append(Planned(h, out, is_finish=True))
    plan.finish_calls = [
        end_call(
            keys,
            settings,
            p.held,
            p.output.finish_reason or FinishReason.STOP,
            p.output,
            error=p.output.error,
        )
        for p in plan.finishes
    ]
    return plan


def settle(planned: Planned, reply: Any) -> str:
    """Apply an acknowledged reply to the worker's record; returns what to do next:
    'ok', 'drop' (lease lost or gap: let it resume elsewhere), 'cancel' or 'done'."""
    if planned.is_finish:
        return "drop" if reply == LEASE_LOST else "done"
    code = int(reply)
    if code in (LEASE_LOST, GAP):
        return "drop"
    planned.held.record(planned.output.new_token_ids, planned.output.text)
    return "cancel" if code == CANCEL_REQUESTED else "ok"
