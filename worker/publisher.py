"""Turning one engine step into one pipelined round trip, and its replies into actions.

A step is one publish call (every request's token event) followed by a finish call
per request that ended. Nothing about a request changes until Redis has
acknowledged the round trip, so a step whose publish failed (Redis away) is simply
sent again; the publish script's index check makes that exactly-once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.keys import Keys
from shared.models import FinishReason, TokenEvent, dumps
from shared.scripts import ScriptCall, TokenPublish, finish_call, publish_call
from shared.settings import Settings
from worker.engine.outputs import RequestOutput
from worker.held import STATE_OF_REASON, Held

# publish.lua's codes per event (1, published, needs no action).
LEASE_LOST, CANCEL_REQUESTED, GAP = 0, 2, 3


@dataclass(frozen=True)
class Planned:
    held: Held
    output: RequestOutput
    is_finish: bool


@dataclass
class StepPlan:
    """What a step sends: ``calls`` in order, and which request each reply is about."""

    tokens: list[Planned] = field(default_factory=list)
    finishes: list[Planned] = field(default_factory=list)
    calls: list[ScriptCall] = field(default_factory=list)

    def pair(self, replies: list[Any]) -> list[tuple[Planned, Any]]:
        """Each planned item with its reply (the publish call answers with a list)."""
        codes = list(replies[0]) if self.tokens else []
        finish_replies = replies[1:] if self.tokens else replies
        return [
            *zip(self.tokens, codes, strict=True),
            *zip(self.finishes, finish_replies, strict=True),
        ]


def token_publish(held: Held, out: RequestOutput) -> TokenPublish:
    logprobs = tuple(out.logprobs) if out.logprobs else None
    event = TokenEvent(
        index=out.index, token_ids=tuple(out.new_token_ids), text=out.text, logprobs=logprobs
    )
    return TokenPublish(
        held.request_id, held.lease_token, dumps(event), out.index, len(out.new_token_ids)
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
    if plan.tokens:
        plan.calls.append(
            publish_call(keys, [token_publish(p.held, p.output) for p in plan.tokens])
        )
    plan.calls += [
        end_call(keys, settings, p.held, p.output.finish_reason or FinishReason.STOP, p.output)
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
