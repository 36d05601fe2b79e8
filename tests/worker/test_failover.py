"""The worker loop across a Redis failover, against fakeredis and a scripted engine: a
stream whose tail the new primary lacks resumes from what it holds, with no gap and no
repeat; after Redis was away no one reaps for a lease (live workers renew first)."""

from __future__ import annotations

import logging
import time
from typing import Any

import fakeredis
import pytest

from producer.client import Client, Handle
from shared.keys import Keys
from shared.models import FinishReason, TokenEvent
from shared.settings import Settings
from tests.conftest import serve
from tests.worker.fakes import ScriptedEngine, lockstep
from worker.heartbeat import Heartbeat
from worker.service import WorkerService

MODEL = "m"


@pytest.fixture
def rig(fake_redis: fakeredis.FakeRedis) -> tuple[Client, WorkerService, ScriptedEngine]:
    settings = Settings(publish_coalesce_ms=0)  # a write per step
    serve(fake_redis, MODEL)
    engine = ScriptedEngine()
    service = lockstep(WorkerService(engine, fake_redis, settings, MODEL, "w1"))
    return Client(connection=fake_redis, settings=settings), service, engine


def lose_the_tail(connection: fakeredis.FakeRedis, handle: Handle, num_entries: int) -> None:
    """What a new primary holds when replication had not caught up with the old one: the
    stream's last entries (and the count that goes with them) are gone."""
    keys = Keys()
    last: Any = connection.xrevrange(keys.stream(handle.id), count=num_entries)
    connection.xdel(keys.stream(handle.id), *[entry_id for entry_id, _ in last])
    connection.hincrby(keys.request(handle.id), "num_generated", -num_entries)


def token_indexes(handle: Handle) -> list[int]:
    events = [e.event for e in handle.stream(timeout=1)]
    return [s.index for e in events if isinstance(e, TokenEvent) for s in e.split()]


def test_a_stream_whose_tail_a_failover_lost_resumes_from_what_redis_holds(
    rig: Any, fake_redis: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    client, service, engine = rig
    h = client.submit("p", model=MODEL, max_tokens=8)
    for _ in range(4):
        service.iterate()  # t0, t1 and t2 written; t3 computed meanwhile
    lose_the_tail(fake_redis, h, 2)  # the new primary has t0 only
    with caplog.at_level(logging.WARNING, logger="worker.queue"):
        service.run(burst=True)
    assert token_indexes(h) == list(range(8))  # t1 and t2 written again: no gap, no repeat
    result = h.result(timeout=1)
    assert (result.text, result.finish_reason) == ("".join(f"t{i}" for i in range(8)),
                                                   FinishReason.LENGTH)  # fmt: skip
    assert h.status().attempts == 1  # handed back, not reaped: the attempt was given back
    assert engine.added == [h.id, h.id]  # the same worker took it back, once its engine let go
    assert any("lost them" in r.getMessage() for r in caplog.records)


def test_after_redis_was_away_no_one_reaps_for_a_lease(rig: Any) -> None:
    """Every live worker's leases lapsed while Redis was away; each renews them on its
    next beat, so a heartbeat that just saw Redis come back does not reap yet."""
    _, service, _ = rig
    heartbeat = Heartbeat(service.queue, service, {"model": MODEL})
    assert heartbeat.may_reap()
    heartbeat.failed_s = time.monotonic()
    assert not heartbeat.may_reap()
    heartbeat.failed_s -= service.settings.lease_ms / 1000
    assert heartbeat.may_reap()
