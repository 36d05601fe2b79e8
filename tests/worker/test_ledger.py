"""The ledger of what a worker holds: each run's stage, and only the moves its stage
allows."""

from __future__ import annotations

import pytest

from shared.models import GenerationRequest
from shared.ops.claim import Claimed
from shared.ops.renew import RenewCode
from worker.held import Held
from worker.ledger import NEXT, IllegalTransition, Ledger, News, Renewal, Run, Stage


def claim(request_id: str = "r1", token: str = "w1:1") -> Claimed:
    return Claimed(request_id, token, "{}", attempts=1, num_generated=0)


def held_for(run: Run) -> Held:
    return Held(run.request_id, run.lease_token, GenerationRequest(model="m", prompt="p"))


def stage(run: Run) -> Stage:
    """``run``'s stage now (read through a call: each move changes it)."""
    return run.stage


def running(ledger: Ledger, request_id: str = "r1", token: str = "w1:1") -> Run:
    ledger.claim([claim(request_id, token)])
    [run] = ledger.to_admit([claim(request_id, token)])
    ledger.admitted(run, held_for(run))
    return run


def test_a_run_goes_from_its_claim_to_settled_renewed_until_then() -> None:
    ledger = Ledger()
    ledger.claim([claim()])
    assert ledger.leases() == {"r1": "w1:1"}  # renewed from the claim's return
    [run] = ledger.to_admit([claim()])
    assert stage(run) is Stage.CLAIMED
    ledger.admitted(run, held_for(run))
    assert (stage(run), list(ledger.held), ledger.num_running) == (Stage.RUNNING, ["r1"], 1)
    ledger.engine_let_go("r1")
    ledger.finishing("r1")
    assert stage(run) is Stage.FINISHING and ledger.leases() == {"r1": "w1:1"}
    ledger.hand_back(run)  # its finish was written, the engine done with it
    assert (stage(run), ledger.held, ledger.leases()) == (Stage.SETTLED, {}, {})


def test_an_illegal_move_raises_and_changes_nothing() -> None:
    ledger = Ledger()
    run = running(ledger)
    ledger.hand_back(run)  # lease lost while the engine runs it
    assert stage(run) is Stage.HANDED_BACK
    with pytest.raises(IllegalTransition, match="r1: handed_back cannot become waiting"):
        ledger.wait(run)
    assert stage(run) is Stage.HANDED_BACK
    ledger.engine_let_go("r1")
    assert stage(run) is Stage.SETTLED
    with pytest.raises(IllegalTransition, match="settled cannot become settled"):
        ledger.settle(run)
    assert NEXT[Stage.SETTLED] == frozenset()


def test_a_claim_of_an_id_the_engine_still_ends_waits_renewed_and_runs_after() -> None:
    ledger = Ledger()
    old = running(ledger, token="w1:1")
    ledger.hand_back(old)  # handed back; the engine ends the run at its next step
    assert ledger.handed_back("r1") and ledger.leases() == {}
    ledger.claim([claim(token="w1:2")])
    [new] = ledger.to_admit([claim(token="w1:2")])
    assert ledger.in_engine("r1") is old
    ledger.wait(new)
    with pytest.raises(IllegalTransition, match="admitted while the engine runs it"):
        ledger.admitted(new, held_for(new))
    assert ledger.leases() == {"r1": "w1:2"} and ledger.to_admit([]) == []
    ledger.engine_let_go("r1")  # the old run's last output
    assert stage(old) is Stage.SETTLED and ledger.to_admit([]) == [new]
    ledger.admitted(new, held_for(new))
    assert ledger.in_engine("r1") is new and ledger.leases() == {"r1": "w1:2"}


def test_of_two_runs_of_one_id_the_newer_claim_s_lease_is_renewed() -> None:
    """A loop stalled past its leases claims its own request again before it learns
    that the lapsed run is lost: the beat renews the new claim, not the lapsed run."""
    ledger = Ledger()
    running(ledger, token="w1:1")
    ledger.claim([claim(token="w1:2")])
    assert ledger.leases() == {"r1": "w1:2"}


def test_news_about_a_lapsed_run_does_not_touch_the_run_that_replaced_it() -> None:
    ledger = Ledger()
    old = running(ledger, token="w1:1")
    lapsed = Renewal({"r1": "w1:1"}, {"r1": RenewCode.LEASE_LOST})
    ledger.renewed(lapsed)
    ledger.hand_back(old)  # the loop learned it from a write's reply first
    ledger.engine_let_go("r1")
    new = running(ledger, token="w1:2")
    assert ledger.take_news() == []  # the news was about w1:1
    assert stage(new) is Stage.RUNNING and ledger.leases() == {"r1": "w1:2"}
    ledger.renewed(Renewal({"r1": "w1:2"}, {"r1": RenewCode.LEASE_LOST}))
    assert ledger.take_news() == [(new, News.LOST)]


def test_a_lost_lease_of_a_finishing_run_is_left_to_its_finish_and_cancels_are_news() -> None:
    ledger = Ledger()
    finishing, other = running(ledger, "a", "w1:1"), running(ledger, "b", "w1:2")
    ledger.finishing("a")
    codes = {"a": RenewCode.LEASE_LOST, "b": RenewCode.RENEWED}
    ledger.renewed(Renewal({"a": "w1:1", "b": "w1:2"}, codes, frozenset({"b"})))
    assert ledger.take_news() == [(other, News.CANCEL)]
    assert stage(finishing) is Stage.FINISHING


def test_a_failed_admission_renews_none_of_the_rest_and_release_hands_back_all() -> None:
    ledger = Ledger()
    ledger.claim([claim("a", "w1:1"), claim("b", "w1:2")])
    runs = ledger.to_admit([claim("a", "w1:1"), claim("b", "w1:2")])
    ledger.abandon(runs)
    assert ledger.leases() == {} and [stage(r) for r in runs] == [Stage.SETTLED] * 2
    run = running(ledger, "c", "w1:3")
    ledger.claim([claim("d", "w1:4")])
    assert ledger.release_all() == {"c": "w1:3", "d": "w1:4"}
    assert stage(run) is Stage.SETTLED and ledger.leases() == {} and ledger.held == {}


def test_a_lost_claim_is_not_admitted() -> None:
    ledger = Ledger()
    ledger.claim([claim()])
    ledger.renewed(Renewal({"r1": "w1:1"}, {"r1": RenewCode.LEASE_LOST}))
    [(run, news)] = ledger.take_news()
    assert (stage(run), news) == (Stage.CLAIMED, News.LOST)
    ledger.hand_back(run)
    assert ledger.to_admit([claim()]) == [] and ledger.leases() == {}


def test_a_reply_or_news_about_a_run_already_handed_back_is_stale() -> None:
    ledger = Ledger()
    run = running(ledger)
    assert run.held is not None and ledger.run_of(run.held) is run
    beat = Renewal({"r1": "w1:1"}, {"r1": RenewCode.LEASE_LOST})
    ledger.renewed(beat)
    ledger.renewed(beat)  # a second beat before the loop turned says it again
    assert ledger.take_news() == [(run, News.LOST)]
    ledger.hand_back(run)
    assert ledger.run_of(run.held) is None  # a write's reply about it changes nothing
    ledger.renewed(beat)
    assert ledger.take_news() == []
