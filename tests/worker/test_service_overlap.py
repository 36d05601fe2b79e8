"""The worker loop overlapping Redis with its engine: a write or a claim in flight never
holds the engine back (a write for at most MAX_STEPS_WRITING steps), and what a client
reads is still every token once, in order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest

from producer.client import Client, Handle
from shared.models import FinalEvent, RequestState, TokenEvent
from shared.settings import Settings
from tests.conftest import serve
from tests.worker.fakes import ScriptedEngine
from worker.service import MAX_STEPS_WRITING, WorkerService

MODEL = "m"


class Gate:
    """Wraps a callable so that calls wait until ``open``; ``entered`` is set by the first."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner, self.opened, self.entered = inner, threading.Event(), threading.Event()

    def __call__(self, *args: Any) -> Any:
        self.entered.set()
        assert self.opened.wait(timeout=10), "the gate was never opened"
        return self.inner(*args)

    def open(self) -> None:
        self.opened.set()


@pytest.fixture
def setup(fake_redis: fakeredis.FakeRedis) -> tuple[Client, WorkerService, ScriptedEngine]:
    settings = Settings(publish_coalesce_ms=0)  # a write every step
    serve(fake_redis, MODEL)
    engine = ScriptedEngine()
    service = WorkerService(engine, fake_redis, settings, MODEL, "w1")
    return Client(connection=fake_redis, settings=settings), service, engine


def token_indexes(h: Handle) -> list[int]:
    events = [e.event for e in h.stream()]
    assert isinstance(events[-1], FinalEvent)
    return [s.index for t in events if isinstance(t, TokenEvent) for s in t.split()]


def test_a_slow_write_holds_back_the_next_write_not_the_engine(setup: Any) -> None:
    client, service, engine = setup
    h = client.submit("p", model=MODEL, max_tokens=20)
    service.iterate()  # claimed at once (the engine was idle), t0 computed
    gate = Gate(service.queue.write)
    service.queue.write = gate
    service.iterate()  # t0's write goes out, and waits at the gate; t1 computed meanwhile
    assert gate.entered.wait(timeout=5)
    for _ in range(MAX_STEPS_WRITING - 1):
        service.iterate()
    (running,) = engine.running.values()
    assert len(running.output_token_ids) == 1 + MAX_STEPS_WRITING  # t0..t4: none written
    assert h.status().num_generated == 0
    # One more step would run too far past what Redis acknowledged: the loop waits.
    turn = threading.Thread(target=service.iterate)
    turn.start()
    turn.join(timeout=0.3)
    assert turn.is_alive() and len(running.output_token_ids) == 1 + MAX_STEPS_WRITING
    gate.open()
    turn.join(timeout=5)
    assert not turn.is_alive()
    assert len(running.output_token_ids) == 2 + MAX_STEPS_WRITING  # t0 acknowledged, then a step
    service.run(burst=True)
    assert token_indexes(h) == list(range(20))
    assert h.result(timeout=1).text == "".join(f"t{i}" for i in range(20))


def test_a_claim_goes_out_beside_the_step_and_its_request_joins_on_the_turn_after(
    setup: Any,
) -> None:
    client, service, engine = setup
    first = client.submit("p", model=MODEL, max_tokens=20)
    service.iterate()  # the engine was idle: claimed and admitted at once
    gate = Gate(service.queue.claim)
    service.queue.claim = gate
    second = client.submit("q", model=MODEL, max_tokens=3)
    (running,) = engine.running.values()
    service.iterate()  # the claim waits at the gate; the engine steps all the same
    assert gate.entered.wait(timeout=5)
    service.iterate()
    assert len(running.output_token_ids) == 3 and second.id not in engine.added
    gate.open()
    claim = service.claiming
    assert claim is not None
    claim.result(timeout=5)
    service.iterate()
    assert second.id in engine.added
    service.run(burst=True)
    assert token_indexes(first) == list(range(20)) and token_indexes(second) == [0, 1, 2]


def test_what_a_claim_brought_keeps_its_lease_while_a_long_step_runs(
    setup: Any, fake_redis: fakeredis.FakeRedis
) -> None:
    """The loop admits a claim's requests after the step under way; on a loaded host
    that step can outlast a lease. The heartbeat renews them from the claim's return,
    so the reaper does not take them (and an attempt) from a live worker."""
    from shared.keys import Keys, model_tag
    from shared.reaper import reap_once
    from shared.scripts import Scripts
    from worker.heartbeat import Heartbeat

    client, service, engine = setup
    first = client.submit("p", model=MODEL, max_tokens=20)
    service.iterate()  # the engine was idle: claimed and admitted at once
    second = client.submit("q", model=MODEL, max_tokens=3)
    service.iterate()  # the claim goes out beside the step
    claim = service.claiming
    assert claim is not None
    claim.result(timeout=5)
    assert second.id not in engine.added  # not admitted before the loop's next turn
    leases = Keys().leases(model_tag(MODEL))
    fake_redis.zadd(leases, {second.id: 0})  # the step ran past its lease...
    Heartbeat(service.queue, service, {"model": MODEL}).beat()  # ...but a beat came
    reap_once(fake_redis, Scripts(fake_redis), service.settings, model_tag(MODEL), "reaper")
    status = second.status()
    assert status.state is RequestState.RUNNING and status.worker == "w1"
    service.run(burst=True)
    assert token_indexes(first) == list(range(20)) and token_indexes(second) == [0, 1, 2]
    assert second.status().attempts == 1


def test_a_claim_in_flight_when_the_worker_stops_is_handed_back(setup: Any) -> None:
    client, service, _engine = setup
    running = client.submit("p", model=MODEL, max_tokens=50)
    service.iterate()
    gate = Gate(service.queue.claim)
    service.queue.claim = gate
    claimed = client.submit("q", model=MODEL, max_tokens=50)
    service.iterate()
    assert gate.entered.wait(timeout=5)
    service.stopping.set()
    gate.open()
    service.drain(timeout_s=0)
    for h in (running, claimed):
        status = h.status()
        assert status.state is RequestState.QUEUED, h.id  # for another worker, not lost
