"""The lease keeper's rules (when it renews, what it reads of its worker) and the stall
limit the heartbeat applies to its own renewals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import fakeredis
import pytest

from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.keys import Keys, model_tag
from shared.settings import Settings
from tests.conftest import serve
from tests.worker.fakes import ScriptedEngine, lockstep
from worker.heartbeat import Heartbeat
from worker.lease_keeper import LeaseKeeper, Verdict, Watch, cpu_ticks
from worker.service import WorkerService

MODEL = "m"
LEASES = Keys().leases(model_tag(MODEL))


def watch(
    beat_s: float | None = 100.0, turn_age_s: float = 0.0, kept_s: float = -float("inf")
) -> Watch:
    return Watch(
        lease_s=3.0, stall_limit_s=30.0, beat_s=beat_s, turn_age_s=turn_age_s, kept_s=kept_s
    )


@pytest.mark.parametrize(
    ("w", "now_s", "computing", "verdict"),
    [
        (watch(), 101.0, True, Verdict.ON_TIME),  # the heartbeat beat a third of a lease ago
        (watch(beat_s=None), 1e6, True, Verdict.ON_TIME),  # no beat yet: it still loads
        (watch(), 102.0, True, Verdict.RENEW),  # two thirds: late, and the worker computes
        (watch(), 102.0, False, Verdict.NOT_RUNNING),  # stopped, blocked, or gone
        (watch(kept_s=101.5), 102.0, True, Verdict.KEPT),  # renewed half a second ago
        (watch(kept_s=101.0), 102.0, True, Verdict.RENEW),  # a third of a lease ago
        (watch(turn_age_s=29.0), 102.0, True, Verdict.STALLED),  # 29 + 2 s without a turn
        (watch(turn_age_s=27.0), 102.0, True, Verdict.RENEW),
    ],
)
def test_it_renews_only_for_a_late_heartbeat_of_a_computing_worker_within_the_limit(
    w: Watch, now_s: float, computing: bool, verdict: Verdict
) -> None:
    assert w.verdict(now_s, computing) is verdict


def test_a_busy_process_computes_and_a_stopped_one_does_not() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        first = cpu_ticks(busy.pid)
        time.sleep(0.5)
        second = cpu_ticks(busy.pid)
        assert first is not None and second is not None and second > first
        busy.send_signal(signal.SIGSTOP)
        time.sleep(0.2)
        assert cpu_ticks(busy.pid) is None
    finally:
        busy.kill()
        busy.wait()
    assert cpu_ticks(busy.pid) is None  # gone
    assert cpu_ticks(os.getpid()) is not None


def test_the_heartbeat_renews_nothing_once_the_loop_is_stalled(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    settings = Settings(lease_ms=10_000, worker_stall_limit_ms=5_000)
    serve(fake_redis, MODEL)
    service = lockstep(WorkerService(ScriptedEngine(), fake_redis, settings, MODEL, "w1"))
    h = Client(connection=fake_redis, settings=settings).submit("p", model=MODEL, max_tokens=50)
    service.iterate()
    heartbeat = Heartbeat(service.queue, service, {"model": MODEL})
    fake_redis.zadd(LEASES, {h.id: 1})
    service.last_turn_s = time.monotonic() - 6  # no turn for longer than the limit
    heartbeat.beat()
    assert fake_redis.zscore(LEASES, h.id) == 1  # left to lapse
    service.iterate()  # it turns again
    heartbeat.beat()
    assert (fake_redis.zscore(LEASES, h.id) or 0) > 1


def test_the_keeper_comes_up_and_ends_with_its_worker(redis_server: EmbeddedRedis) -> None:
    keeper = LeaseKeeper.start(Settings(redis_url=redis_server.url), model_tag(MODEL), "w1")
    assert keeper.wait_ready(60)
    keeper.beaten(0.1)
    keeper.process.send_signal(signal.SIGINT)  # a Ctrl-C is the worker's to act on
    time.sleep(0.2)
    assert keeper.process.poll() is None
    keeper.stop()  # its stdin ends, as at the worker's exit or death
    assert keeper.process.returncode == 0
