"""publish.lua: a worker's write on its requests' own slots, each request's token event
and, when it ended, its final event, fenced by its lease token."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import orjson

from shared.keys import Keys
from shared.models import FinalEvent
from shared.ops.moves import Fate, Moved
from shared.ops.slots import by_slot, slot_of
from shared.replies import text
from shared.scripts import ScriptCall

__all__ = ["Final", "Finish", "Finished", "Publish", "PublishCode", "TokenPublish", "slot_of"]


class PublishCode(IntEnum):
    """publish.lua's answer per request."""

    LEASE_LOST = 0  # nothing written: another worker holds it now (or it ended)
    PUBLISHED = 1  # written (or it already was: a retried write)
    CANCEL_REQUESTED = 2  # written, and a cancel was asked for
    GAP = 3  # nothing written: the stream holds fewer tokens than the worker counts
    FINISHED = 4  # its final is written (now, or by this write once before)


# FinalEvent fields newer than the gateways of the release before (whose FinalEvent
# refuses fields it does not know): written only when set, so those gateways still read
# every final a worker writes during a rolling upgrade.
UNSET_LEFT_OUT = (
    "prompt_token_ids",
    "detokenized",
    "stop_sequence",
    "prompt_logprobs",
    "refusal",
)


@dataclass(frozen=True)
class Final:
    """A request's end: its final event as the script takes it, without its timings
    (the script splices them in: decoding and encoding the event again in Lua cost
    Redis about a third of a short request's final), and its finish reason; its output
    {text, token_ids}; its terminal state (DEAD dead-letters it)."""

    untimed_json: str
    reason: str
    output_json: bytes
    state: Fate

    @classmethod
    def of(cls, event: FinalEvent, output_json: bytes, state: Fate) -> Final:
        unset = {name for name in UNSET_LEFT_OUT if getattr(event, name) is None}
        untimed = orjson.dumps(event.model_dump(mode="json", exclude={"timings", *unset}))
        return cls(untimed.decode(), event.finish_reason.value, output_json, state)


@dataclass(frozen=True)
class TokenPublish:
    """One request's part of a write: its token event (``event_json`` empty: none) whose
    first token is ``index``, and its final when it ended. With no event, ``index`` is
    the number of tokens published before the final (None: not checked)."""

    request_id: str
    lease_token: str
    event_json: bytes
    index: int | None
    num_tokens: int
    final: Final | None = None

    def args(self) -> tuple[str | int, ...]:
        index = "" if self.index is None else self.index
        return (self.lease_token, self.event_json.decode(), self.num_tokens, index)

    def final_args(self, position: int) -> tuple[str | int, ...]:
        """Its final's group (``position``: its place in the call, from 1)."""
        final = self.final
        if final is None:
            return ()
        return (position, self.request_id, final.untimed_json, final.output_json.decode(),
                final.state.value, final.reason)  # fmt: skip


@dataclass(frozen=True)
class Finished:
    """The final publish.lua wrote: its json (timings filled in) and what settle moves."""

    final_json: str
    moved: Moved


@dataclass(frozen=True)
class Written:
    code: PublishCode
    finished: Finished | None = None  # with code FINISHED


@dataclass(frozen=True)
class Publish:
    """publish.lua over a write: one call on one Redis, one per run of consecutive
    requests on one slot on a cluster (``shared.ops.slots``)."""

    events: Sequence[TokenPublish]

    def calls(self, keys: Keys, ttl_s: int, cluster: bool) -> list[ScriptCall]:
        """The calls' replies, in order, give one reply per event of ``events``."""
        return [_publish_call(keys, ttl_s, run) for run in by_slot(self.events, cluster)]

    def parse(self, replies: Sequence[Sequence[Any]]) -> list[Written]:
        """One reply per event, in the order of ``events``. (Several replies come only
        from a cluster's calls; one reply holds every event either way.)"""
        runs = by_slot(self.events, cluster=len(replies) > 1)
        return [w for run, reply in zip(runs, replies, strict=True) for w in _parse(run, reply)]


def _publish_call(keys: Keys, ttl_s: int, events: Sequence[TokenPublish]) -> ScriptCall:
    per_event = [k for e in events for k in (keys.request(e.request_id), keys.stream(e.request_id))]
    args = [a for e in events for a in e.args()]
    finals = [a for n, e in enumerate(events, 1) for a in e.final_args(n)]
    return ScriptCall("publish", per_event, [ttl_s, keys.lifecycle_channel(), *args, *finals])


def _parse(events: Sequence[TokenPublish], reply: Sequence[Any]) -> list[Written]:
    """n codes, then (final json, state, finished ms) for each FINISHED code in order."""
    codes = [PublishCode(int(c)) for c in reply[: len(events)]]
    rest = iter(reply[len(events) :])
    return [_written(e, c, rest) for e, c in zip(events, codes, strict=True)]


def _written(event: TokenPublish, code: PublishCode, rest: Iterator[Any]) -> Written:
    if code is not PublishCode.FINISHED:
        return Written(code)
    final, state, at = next(rest), next(rest), next(rest)
    moved = Moved(event.request_id, event.lease_token, Fate(text(state)), text(at))
    return Written(code, Finished(text(final), moved))


@dataclass(frozen=True)
class Finish:
    """A final alone (a request that ends outside a step): publish.lua with no event."""

    request_id: str
    lease_token: str
    final: FinalEvent
    output_json: bytes
    state: Fate
    num_published: int | None = None  # the tokens its stream must hold (None: any)

    def event(self) -> TokenPublish:
        final = Final.of(self.final, self.output_json, self.state)
        return TokenPublish(self.request_id, self.lease_token, b"", self.num_published, 0, final)

    def call(self, keys: Keys, ttl_s: int) -> ScriptCall:
        (call,) = Publish([self.event()]).calls(keys, ttl_s, cluster=False)
        return call

    def parse(self, reply: Sequence[Any]) -> Finished | None:
        """None when nothing was written (the lease lost, or a gap)."""
        (written,) = Publish([self.event()]).parse([reply])
        return written.finished
