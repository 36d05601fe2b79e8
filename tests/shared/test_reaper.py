"""Reaping, hand-back and dead-letter retry: against fakeredis and a real redis-server."""

from __future__ import annotations

import time

import redis

from producer.client import Client
from shared.flows import drive, fence_flow, retry_flow
from shared.keys import Keys
from shared.models import FinishReason, RequestState
from shared.ops.moves import Fate, FenceMode
from shared.reaper import Reaped, reap_once
from shared.replies import text
from shared.scripts import Scripts
from tests.shared.test_scripts import TAG, claim, publish_token


def _expire_leases(r: redis.Redis) -> None:
    for member in r.zrange(Keys().leases(TAG), 0, -1):
        r.zadd(Keys().leases(TAG), {text(member): 0})


def _reap(client: Client, owner: str = "reaper") -> Reaped | None:
    r = client.redis
    return reap_once(r, Scripts(r), client.settings, TAG, owner)


def test_an_expired_lease_goes_back_ahead_of_all_new_work(client: Client) -> None:
    dying, other = client.submit("a", priority="normal"), client.submit("z", priority="low")
    for c in claim(client.redis, client.settings, 2):
        publish_token(client.redis, c, 0, "x")
    later = client.submit("b", priority="normal")
    above = client.submit("c", priority="critical")
    _expire_leases(client.redis)
    assert _reap(client) == Reaped(requeued=2)
    # Its reader is waiting mid-answer: before new work of any priority, by priority.
    assert [h.position() for h in (dying, other, above, later)] == [0, 1, 2, 3]
    status = dying.status()
    assert (status.state, status.attempts, status.worker) == (RequestState.QUEUED, 1, None)


def test_a_request_that_published_nothing_goes_back_among_new_work(client: Client) -> None:
    """Only a stream cut mid-answer has a reader waiting for the rest; one that never
    started goes back to the place it had among new work, so it cannot crowd out the
    room that workers keep for resumed streams."""
    mid_answer, unstarted = client.submit("a", priority="low"), client.submit("z")
    (started,) = [
        c for c in claim(client.redis, client.settings, 2) if c.request_id == mid_answer.id
    ]
    publish_token(client.redis, started, 0, "x")
    later, above = client.submit("b"), client.submit("c", priority="critical")
    _expire_leases(client.redis)
    assert _reap(client) == Reaped(requeued=2)
    assert [h.position() for h in (mid_answer, above, unstarted, later)] == [0, 1, 2, 3]


def kill_every_attempt(client: Client, request_id: str) -> None:
    """Claim the request and let its lease lapse until its attempts run out."""
    for _ in range(client.settings.max_attempts):
        assert [c.request_id for c in claim(client.redis, client.settings, 1)] == [request_id]
        _expire_leases(client.redis)
        client.redis.delete(Keys().reaper_lock(TAG))
        _reap(client)


def test_a_request_that_keeps_losing_its_worker_ends_in_dead_letter(client: Client) -> None:
    h = client.submit("poison")
    kill_every_attempt(client, h.id)
    result = h.result(timeout=1)
    assert result.finish_reason is FinishReason.ERROR
    assert "attempts exhausted" in (result.error or "")
    assert h.status().state is RequestState.DEAD
    assert client.redis.zscore(Keys().dead(TAG), h.id) is not None


def test_one_reaper_sweeps_at_a_time(client: Client) -> None:
    assert _reap(client, "first") == Reaped()
    assert _reap(client, "second") is None


def test_a_queued_request_past_its_deadline_expires_without_a_worker(client: Client) -> None:
    h = client.submit("late", deadline=0.05)
    time.sleep(0.1)
    assert _reap(client) == Reaped(ended=1)
    assert h.result(timeout=1).finish_reason is FinishReason.EXPIRED
    assert h.position() is None


def test_release_hands_back_without_spending_an_attempt(client: Client) -> None:
    h = client.submit("a")
    (c,) = claim(client.redis, client.settings, 1)
    scripts = Scripts(client.redis)
    flow = fence_flow(
        client.keys, client.settings, TAG, {c.request_id: c.lease_token}, FenceMode.RELEASE
    )
    assert [(m.state, m.fenced) for m in drive(scripts, flow)] == [(Fate.QUEUED, True)]
    status = h.status()
    assert (status.state, status.attempts, status.position) == (RequestState.QUEUED, 0, 0)
    flow = fence_flow(
        client.keys, client.settings, TAG, {c.request_id: c.lease_token}, FenceMode.RELEASE
    )
    assert [m.fenced for m in drive(scripts, flow)] == [False]


def test_retry_runs_a_dead_request_again_from_the_start(client: Client) -> None:
    h = client.submit("again")
    kill_every_attempt(client, h.id)
    scripts = Scripts(client.redis)
    assert drive(scripts, retry_flow(client.keys, h.id))
    status = h.status()
    assert (status.state, status.attempts, status.position) == (RequestState.QUEUED, 0, 0)
    assert client.redis.xlen(Keys().stream(h.id)) == 0
    assert not drive(scripts, retry_flow(client.keys, h.id))


def test_ended_requests_are_indexed_for_dashboards(client: Client) -> None:
    cancelled = client.submit("a")
    cancelled.cancel()
    dead = client.submit("b")
    kill_every_attempt(client, dead.id)
    recent = [text(m) for m in client.redis.zrange(Keys().recent(TAG), 0, -1)]
    failed = [text(m) for m in client.redis.zrange(Keys().failed(TAG), 0, -1)]
    assert (recent, failed) == ([cancelled.id, dead.id], [dead.id])


def test_a_request_cancelled_while_its_worker_died_is_not_run_again(client: Client) -> None:
    h = client.submit("a")
    claim(client.redis, client.settings, 1)
    assert h.cancel() == "requested"
    _expire_leases(client.redis)
    assert _reap(client) == Reaped(ended=1)
    assert h.result(timeout=1).finish_reason is FinishReason.CANCELLED
    assert h.position() is None


async def test_gateways_reap_with_the_asyncio_twin(redis_server: object) -> None:
    import redis.asyncio

    from shared.reaper import reap_once_async
    from shared.scripts import AsyncScripts
    from tests.conftest import serve

    url = redis_server.url  # type: ignore[attr-defined]
    sync = redis.Redis.from_url(url)
    sync.flushall()
    serve(sync, "SmolLM2-135M-Instruct")
    client = Client(connection=sync)
    h = client.submit("a")
    claim(sync, client.settings, 1)
    _expire_leases(sync)
    connection = redis.asyncio.Redis.from_url(url)
    reaped = await reap_once_async(connection, AsyncScripts(connection), client.settings, TAG, "gw")
    assert reaped == Reaped(requeued=1)
    assert h.position() == 0
    await connection.aclose()
    sync.close()
