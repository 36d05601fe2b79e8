"""What a worker holds: one record per run of a request (one claim, one lease token), in
one place, with explicit transitions.

::

    CLAIMED ──▶ RUNNING ──▶ FINISHING ──▶ SETTLED
       │  ▲        │            │            ▲
       ▼  │        ▼            ▼            │
    WAITING    HANDED_BACK ◀────┘ ───────────┘

A claim takes a request (CLAIMED); the loop gives it to the engine (RUNNING), or, when
the engine still ends an earlier run of the same id here, keeps it WAITING until the
engine lets go. A run whose final is taken into a write is FINISHING: that write's reply
settles it. A run that is no longer this worker's while the engine still runs it (its
lease lost or given back, or its finish written before the engine was done) is
HANDED_BACK until the engine's last output for it. Every lease of a run before
HANDED_BACK is renewed; a run leaves the ledger SETTLED.

Runs are told apart by their lease token, not by the request's id: when a worker's
leases lapsed (a stalled loop) it may claim its own request again while its engine
still runs the lapsed run, and what the heartbeat or a write's reply learned about the
lapsed run must not touch the new one (that was the way a re-claim could lapse once
more). A claim of an id whose earlier run is still live here means that run's lease was
taken: the loop hands it back (``superseded``).

Three threads use it: the claimer adds claims, the heartbeat reads the leases to renew
and returns what it learned (``renewed``), the loop does everything else and reads that
news between steps (``take_news``). Nothing here calls the engine or Redis.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from shared.ops.claim import Claimed
from shared.ops.renew import RenewCode
from worker.held import Held


class Stage(StrEnum):
    CLAIMED = "claimed"  # a claim took it; not given to the engine yet
    WAITING = "waiting"  # claimed again while the engine still ends an earlier run here
    RUNNING = "running"  # admitted: the engine has it
    FINISHING = "finishing"  # its final is in a write, whose reply settles it
    HANDED_BACK = "handed_back"  # not this worker's any more; the engine still ends it
    SETTLED = "settled"  # nothing of it left here


NEXT: dict[Stage, frozenset[Stage]] = {
    Stage.CLAIMED: frozenset({Stage.WAITING, Stage.RUNNING, Stage.SETTLED}),
    Stage.WAITING: frozenset({Stage.RUNNING, Stage.SETTLED}),
    Stage.RUNNING: frozenset({Stage.FINISHING, Stage.HANDED_BACK, Stage.SETTLED}),
    Stage.FINISHING: frozenset({Stage.HANDED_BACK, Stage.SETTLED}),
    Stage.HANDED_BACK: frozenset({Stage.SETTLED}),
    Stage.SETTLED: frozenset(),
}
RENEWED = frozenset({Stage.CLAIMED, Stage.WAITING, Stage.RUNNING, Stage.FINISHING})
IN_ENGINE = frozenset({Stage.RUNNING, Stage.FINISHING, Stage.HANDED_BACK})


class IllegalTransition(RuntimeError):
    """A run was moved where its stage does not lead: a bug in the worker's loop."""


@dataclass(eq=False)
class Run:
    """One run of a request on this worker: its claim and where it stands."""

    claimed: Claimed
    stage: Stage = Stage.CLAIMED
    held: Held | None = None  # its record of what was published, from admission on
    engine_done: bool = False  # the engine gave its last output for it
    abort_asked: bool = False  # the engine was asked to end it

    @property
    def request_id(self) -> str:
        return self.claimed.request_id

    @property
    def lease_token(self) -> str:
        return self.claimed.lease_token


class News(StrEnum):
    """What a heartbeat learned about a run, for the loop to act on."""

    LOST = "lost"  # its lease is gone: another worker resumes it
    CANCEL = "cancel"  # a cancel was asked for


@dataclass(frozen=True)
class Renewal:
    """What one beat renewed (id -> lease token sent) and learned."""

    sent: dict[str, str] = field(default_factory=dict)
    codes: dict[str, RenewCode] = field(default_factory=dict)
    cancelled: frozenset[str] = frozenset()

    def news(self) -> list[tuple[str, str, News]]:
        """(request id, lease token, news) for each lease lost or cancel found."""
        found = []
        for request_id, code in self.codes.items():
            token = self.sent[request_id]
            if code is RenewCode.LEASE_LOST:
                found.append((request_id, token, News.LOST))
            elif request_id in self.cancelled:
                found.append((request_id, token, News.CANCEL))
        return found


class Ledger:
    """Every run this worker holds (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: dict[str, Run] = {}  # lease token -> run, CLAIMED or WAITING
        self._engine: dict[str, Run] = {}  # request id -> the engine's run of it
        # request id -> record, for the runs the engine runs for this worker (RUNNING or
        # FINISHING): what a write is planned over.
        self.held: dict[str, Held] = {}
        self._news: list[tuple[str, str, News]] = []

    # The claimer's and the heartbeat's side.

    def claim(self, claims: Iterable[Claimed]) -> None:
        """A claim's return: each run CLAIMED, its lease renewed from now on."""
        with self._lock:
            for c in claims:
                self._claims[c.lease_token] = Run(c)

    def leases(self) -> dict[str, str]:
        """The leases to renew (id -> token): every run before HANDED_BACK; of two runs
        of one id, the newer claim's (the older one's lease is gone: it was claimed
        again)."""
        with self._lock:
            running = {rid: r.lease_token for rid, r in self._engine.items() if r.stage in RENEWED}
            return {**running, **{r.request_id: t for t, r in self._claims.items()}}

    def renewed(self, renewal: Renewal) -> None:
        """A beat's result, kept for the loop's next turn."""
        news = renewal.news()
        if news:
            with self._lock:
                self._news.extend(news)

    def fingerprints(self) -> list[str]:
        """The prefix fingerprints of the runs in the engine, newest first."""
        with self._lock:
            return [fp for h in reversed(self.held.values()) for fp in h.fingerprints]

    @property
    def num_running(self) -> int:
        return len(self.held)

    # The loop's side.

    def take_news(self) -> list[tuple[Run, News]]:
        """What the heartbeat learned since the last call, about runs still held by the
        lease it was about (news of a run since settled or superseded is dropped). A
        lost lease of a FINISHING run needs nothing: its finish's reply settles it."""
        with self._lock:
            news, self._news = self._news, []
        found: dict[tuple[str, News], tuple[Run, News]] = {}  # two beats may say the same
        for request_id, token, what in news:
            run = self.run(request_id, token)
            if run is None or (what is News.LOST and run.stage is Stage.FINISHING):
                continue
            found[(token, what)] = (run, what)
        return list(found.values())

    def run(self, request_id: str, lease_token: str) -> Run | None:
        """The run of ``request_id`` under ``lease_token``, if it is still held."""
        with self._lock:
            claim = self._claims.get(lease_token)
            if claim is not None:
                return claim
            run = self._engine.get(request_id)
        if run is None or run.lease_token != lease_token or run.stage not in RENEWED:
            return None
        return run

    def run_of(self, held: Held) -> Run | None:
        """The engine's run whose record is ``held``, while it is this worker's (None: it
        was settled or handed back since, and a reply about it is stale)."""
        run = self._engine.get(held.request_id)
        if run is None or run.held is not held or run.stage not in RENEWED:
            return None
        return run

    def to_admit(self, claims: Iterable[Claimed]) -> list[Run]:
        """The runs to give the engine now: those WAITING whose id the engine let go of,
        then ``claims`` still CLAIMED (one whose lease was found lost is gone)."""
        with self._lock:
            ready = [
                r
                for r in self._claims.values()
                if r.stage is Stage.WAITING and r.request_id not in self._engine
            ]
            fresh = [self._claims.get(c.lease_token) for c in claims]
        return [*ready, *[r for r in fresh if r is not None and r.stage is Stage.CLAIMED]]

    def in_engine(self, request_id: str) -> Run | None:
        """The engine's run of ``request_id``: one claimed again while it runs is
        superseded (``superseded``); one HANDED_BACK makes a new claim wait."""
        return self._engine.get(request_id)

    def wait(self, run: Run) -> None:
        self._move(run, Stage.WAITING)

    def admitted(self, run: Run, held: Held) -> None:
        """The engine took ``run`` (its id free there)."""
        if run.request_id in self._engine:
            raise IllegalTransition(f"{run.request_id} admitted while the engine runs it")
        with self._lock:
            self._move(run, Stage.RUNNING)
            run.held = held
            del self._claims[run.lease_token]
            self._engine[run.request_id] = run
            self.held[run.request_id] = held

    def finishing(self, request_id: str) -> None:
        """Its final was taken into a write."""
        run = self._engine.get(request_id)
        if run is not None and run.stage is Stage.RUNNING:
            self._move(run, Stage.FINISHING)

    def engine_let_go(self, request_id: str) -> Run | None:
        """The engine's last output for ``request_id``: a HANDED_BACK run is settled (a
        claim of its id waiting may run now); a held one is marked, and returned."""
        run = self._engine.get(request_id)
        if run is None:
            return None
        run.engine_done = True
        if run.stage is Stage.HANDED_BACK:
            self._end(run)
            return None
        return run

    def handed_back(self, request_id: str) -> bool:
        """Whether the engine's run of ``request_id`` is no longer this worker's (its
        outputs are not published)."""
        run = self._engine.get(request_id)
        return run is not None and run.stage is Stage.HANDED_BACK

    def hand_back(self, run: Run) -> None:
        """``run`` is no longer this worker's (lease lost or given back, or its finish
        written): settled, or HANDED_BACK while the engine still runs it."""
        if run.stage in (Stage.CLAIMED, Stage.WAITING) or run.engine_done:
            self.settle(run)
        else:
            self._move(run, Stage.HANDED_BACK)
            with self._lock:
                self.held.pop(run.request_id, None)

    def settle(self, run: Run) -> None:
        """Nothing of ``run`` is left here."""
        self._end(run)

    def abandon(self, runs: Iterable[Run]) -> None:
        """Runs a failed admission left unadmitted: settled here, their leases left to
        lapse (the reaper puts them back), so nothing is renewed that will not run."""
        for run in runs:
            if run.stage in (Stage.CLAIMED, Stage.WAITING):
                self._end(run)

    def release_all(self) -> dict[str, str]:
        """Every renewed run settled; their leases (id -> token), to hand back."""
        with self._lock:
            runs = [*self._claims.values(), *self._engine.values()]
        held = [r for r in runs if r.stage in RENEWED]
        leases = {r.request_id: r.lease_token for r in held}
        for run in held:
            self._end(run)
        return leases

    def _end(self, run: Run) -> None:
        self._move(run, Stage.SETTLED)
        with self._lock:
            self._claims.pop(run.lease_token, None)
            if self._engine.get(run.request_id) is run:
                del self._engine[run.request_id]
                self.held.pop(run.request_id, None)

    @staticmethod
    def _move(run: Run, stage: Stage) -> None:
        if stage not in NEXT[run.stage]:
            raise IllegalTransition(f"{run.request_id}: {run.stage} cannot become {stage}")
        run.stage = stage
