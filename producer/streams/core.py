"""Following many Redis Streams at once, without IO: who follows which stream from where,
where the next read starts, and handing each follower what it has not seen.

A follower joining mid-read must not lose what lies between its cursor and the read
in flight, so a read's entries go only to followers whose cursor is at or past where
that read started; the others are served by the next read, which starts from the
slowest follower's cursor. Followers drop what they have already seen, so nothing is
delivered twice either.

A stream followed from its start before its request runs (a queued request) has
nothing to read, and naming it in every read costs Redis work per read: such a stream
is dormant, named once when followed (in case it holds entries already) and then only
in a periodic sweep, until it is marked started (``started``: its request's start, as
the lifecycle channel tells it) or a read returns entries of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from time import monotonic
from typing import Any, Generic, Protocol, TypeVar

from shared.replies import text

E = TypeVar("E")
# Streams marked started are remembered this long (and, past RECENT_MAX of them, the
# older ones forgotten), so one followed just after its request started is not dormant.
RECENT_S = 30.0
RECENT_MAX = 10_000
Cursor = tuple[int, int]
MAX_ID_PART = 2**64 - 1
# What one stream entry (key, id, fields) becomes for its followers (often one item);
# raising passes the error on to them.
Parse = Callable[[str, str, Any], list[E]]


class Signal(Protocol):
    """asyncio.Event or threading.Event: how a follower is woken."""

    def set(self) -> None: ...

    def clear(self) -> None: ...


def parse_cursor(stream_id: str) -> Cursor:
    """``"<ms>-<seq>"`` as a comparable pair; raises ValueError for anything else (an id
    Redis would refuse must never reach the shared XREAD, where it would fail every stream)."""
    ms, sep, seq = stream_id.partition("-")
    if not sep or not ms.isascii() or not ms.isdigit() or not seq.isascii() or not seq.isdigit():
        raise ValueError(f"not a stream id: {stream_id!r}")
    cursor = int(ms), int(seq)
    if max(cursor) > MAX_ID_PART:
        raise ValueError(f"stream id {stream_id!r} is out of range")
    return cursor


def format_cursor(cursor: Cursor) -> str:
    return f"{cursor[0]}-{cursor[1]}"


@dataclass(eq=False)
class Subscription(Generic[E]):
    """One follower of one stream: what has arrived for it and not been taken yet."""

    key: str
    cursor: Cursor
    signal: Signal
    pending: list[E] = field(default_factory=list)
    error: Exception | None = None
    quiet_ticks: int = 0

    def offer(self, items: list[E], entry_cursor: Cursor) -> None:
        if entry_cursor > self.cursor:
            self.cursor = entry_cursor
            if items:
                self.pending.extend(items)
                self.quiet_ticks = 0
                self.signal.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.signal.set()

    def tick(self, ticks_to_idle: int) -> None:
        self.quiet_ticks += 1
        if self.quiet_ticks >= ticks_to_idle:
            self.quiet_ticks = 0
            self.signal.set()  # wakes the follower with nothing: a quiet spell

    def take(self) -> list[E]:
        """What has arrived (empty after a quiet spell); raises what parsing raised."""
        self.signal.clear()
        if self.error is not None:
            raise self.error
        batch, self.pending = self.pending, []
        return batch


class Followers(Generic[E]):
    """Every followed stream, its followers, and where the next read of it starts."""

    def __init__(self, parse: Parse[E], dormancy: bool = False) -> None:
        """``dormancy``: streams followed from their start are dormant until marked
        started (someone must call ``started``: see the module's docstring)."""
        self._parse = parse
        self._subs: dict[str, set[Subscription[E]]] = {}
        self._cursors: dict[str, str] = {}  # as the id string XREAD takes
        self._dormancy = dormancy
        self._dormant: set[str] = set()
        self._probe: set[str] = set()  # dormant streams the next read names once
        self._recent: dict[str, float] = {}  # streams marked started lately -> when

    @property
    def num_subscriptions(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def __bool__(self) -> bool:
        return bool(self._subs)

    def add(self, key: str, after: str, signal: Signal) -> Subscription[E]:
        """A follower of ``key`` from after ``after``; ValueError for a bad id."""
        sub = Subscription[E](key, parse_cursor(after), signal)
        first = key not in self._subs
        self._subs.setdefault(key, set()).add(sub)
        current = self._cursors.get(key)
        if current is None or sub.cursor < parse_cursor(current):
            self._cursors[key] = format_cursor(sub.cursor)
        if first and self._dormancy and sub.cursor == (0, 0) and key not in self._recent:
            self._dormant.add(key)
            self._probe.add(key)
        elif sub.cursor != (0, 0):
            self._dormant.discard(key)
        return sub

    def remove(self, sub: Subscription[E]) -> None:
        subs = self._subs.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.key]
                del self._cursors[sub.key]
                self._dormant.discard(sub.key)
                self._probe.discard(sub.key)

    def started(self, key: str, now_s: float | None = None) -> bool:
        """Stream ``key``'s request started: named in every read from now on (also if
        it is followed only later, for a while). True when a dormant followed stream
        woke: a read in flight should start over to name it."""
        now_s = monotonic() if now_s is None else now_s
        self._recent[key] = now_s
        if len(self._recent) > RECENT_MAX:
            self._recent = {k: t for k, t in self._recent.items() if now_s - t < RECENT_S}
        if key in self._dormant:
            self._dormant.discard(key)
            return True
        return False

    def cursors(self, sweep: bool = True) -> dict[str, str]:
        """Where the next read of each stream starts (a copy: the read's own record).
        Without ``sweep``, dormant streams are left out, but for those just followed."""
        probe, self._probe = self._probe, set()
        if sweep or not self._dormant:
            return dict(self._cursors)
        named = (k for k in self._cursors if k not in self._dormant or k in probe)
        return {k: self._cursors[k] for k in named}

    def tick(self, ticks_to_idle: int) -> None:
        for subs in self._subs.values():
            for sub in subs:
                sub.tick(ticks_to_idle)

    def dispatch(
        self, entries: Iterable[tuple[str, Any, Any]], read_from: Mapping[str, str]
    ) -> None:
        """Hand the entries of a read that started at ``read_from`` to their followers."""
        seen: dict[str, list[Subscription[E]]] = {}
        for key, entry_id, fields in entries:
            eligible = seen.get(key)
            if eligible is None:
                eligible = seen[key] = self._eligible(key, read_from)
            if eligible:
                self._offer(eligible, key, text(entry_id), fields)
        for key in seen:
            self._dormant.discard(key)  # it has entries: its request runs (or ran)
            self._advance(key)

    def _eligible(self, key: str, read_from: Mapping[str, str]) -> list[Subscription[E]]:
        start = read_from.get(key)
        if start is None:
            return []
        start_cursor = parse_cursor(start)
        return [s for s in self._subs.get(key, ()) if s.cursor >= start_cursor]

    def _offer(self, subs: list[Subscription[E]], key: str, entry_id: str, fields: Any) -> None:
        ms, _, seq = entry_id.partition("-")  # Redis's own ids need no checking
        cursor = int(ms), int(seq)
        try:
            items = self._parse(key, entry_id, fields)
        except Exception as e:  # the follower raises it, not the reader
            for sub in subs:
                if cursor > sub.cursor:
                    sub.cursor = cursor
                    sub.fail(e)
            return
        for sub in subs:
            sub.offer(items, cursor)

    def _advance(self, key: str) -> None:
        # The next read starts at the slowest follower, so a follower that joined
        # behind the read just served is served from its own cursor next time.
        subs = self._subs.get(key)
        if subs:
            self._cursors[key] = format_cursor(min(s.cursor for s in subs))


def xread_entries(reply: Any) -> Iterable[tuple[str, Any, Any]]:
    """(stream key, entry id, fields) from an XREAD reply, RESP2 list or RESP3 map."""
    if not reply:
        return
    pairs = reply.items() if isinstance(reply, dict) else reply
    for key, entries in pairs:
        name = text(key)
        for entry_id, fields in entries:
            yield name, entry_id, fields


def raw_reply(response: Any, **_: Any) -> Any:
    """A response callback that keeps Redis's reply as it is (no dict per entry)."""
    return response
