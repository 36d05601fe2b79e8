"""The worker loop against fakeredis and a scripted engine: what clients see."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import fakeredis
import orjson
import pytest
import redis

from producer.client import Client, Handle
from shared.keys import Keys, model_tag, new_request_id
from shared.models import FinalEvent, FinishReason, RequestState, TokenEvent
from shared.reaper import reap_once
from shared.scripts import Scripts
from shared.settings import Settings
from shared.usage import last_hours, read_usage
from tests.conftest import as_tenant, serve
from tests.worker.fakes import ScriptedEngine, lockstep
from worker.engine.outputs import RequestOutput
from worker.engine.request import EngineRequest
from worker.engine_like import EngineGone
from worker.service import RESUMED_POLL_S, WorkerService

MODEL = "m"


@pytest.fixture
def setup(fake_redis: fakeredis.FakeRedis) -> tuple[Client, WorkerService, ScriptedEngine]:
    settings = Settings(publish_coalesce_ms=0)  # a write per step (tests/worker/test_coalesce.py)
    serve(fake_redis, MODEL)
    engine = ScriptedEngine()
    service = lockstep(WorkerService(engine, fake_redis, settings, MODEL, "w1"))
    return Client(connection=fake_redis, settings=settings), service, engine


def test_claims_only_what_fits_then_drains_the_queue(setup: Any) -> None:
    client, service, _engine = setup
    handles = [client.submit(f"p {i}", model=MODEL, max_tokens=3) for i in range(6)]
    assert service.intake() == 4
    assert [h.position() for h in handles[4:]] == [0, 1]
    service.run(burst=True)
    for h in handles:
        result = h.result(timeout=1)
        assert (result.text, result.finish_reason) == ("t0t1t2", FinishReason.LENGTH)
        indexes = [e.event.index for e in h.stream() if isinstance(e.event, TokenEvent)]
        assert indexes == [0, 1, 2]


def test_a_finished_request_counts_in_its_tenants_usage_and_fair_share(setup: Any) -> None:
    client, service, _ = setup
    long = "w " * 40  # 40 prompt tokens, 50 generated: beyond enqueue's estimate
    h = as_tenant(client, "acme").submit(long, model=MODEL, max_tokens=50)
    service.run(burst=True)
    result = h.result(timeout=1)
    (row,) = read_usage(client.redis, client.keys, last_hours(1))
    assert (row.tenant, row.prompt_tokens, row.completion_tokens, row.requests) == (
        "acme",
        result.usage.prompt_tokens,
        result.usage.completion_tokens,
        1,
    )
    tags = client.redis.zrange(client.keys.fair_tags(model_tag(MODEL)), 0, -1)
    assert tags == [b"50:acme"]  # charged for what it used beyond the estimate
    assert 'tenant="acme"' in service.metrics.render().decode()


def test_a_request_queued_by_the_previous_release_keeps_its_tenant(
    setup: Any, fake_redis: fakeredis.FakeRedis
) -> None:
    """Schema version 1 carried the tenant and its weight as metadata items: a payload
    queued so, read by this worker, still counts to its tenant."""
    client, service, _ = setup
    h = client.submit("w " * 10, model=MODEL, max_tokens=3)
    version_1 = {
        "version": 1,
        "model": MODEL,
        "prompt": "w " * 10,
        "sampling": {"max_tokens": 3, "temperature": 0.0},
        "metadata": {"tenant": "acme", "tenant_weight": 2, "note": "kept"},
    }
    fake_redis.hset(Keys().request(h.id), "payload", orjson.dumps(version_1))
    service.run(burst=True)
    assert h.result(timeout=1).finish_reason is FinishReason.LENGTH
    (row,) = read_usage(client.redis, client.keys, last_hours(1))
    assert (row.tenant, row.completion_tokens, row.requests) == ("acme", 3, 1)
    assert 'tenant="acme"' in service.metrics.render().decode()


def test_cancel_of_a_running_request_ends_its_stream_within_a_step(setup: Any) -> None:
    client, service, _ = setup
    h = client.submit("p", model=MODEL, max_tokens=50)
    service.iterate()
    assert h.cancel() == "requested"
    service.iterate()  # this step's publish sees the flag
    service.iterate()  # the engine ends it at the next step
    events = [e.event for e in h.stream()]
    assert isinstance(events[-1], FinalEvent)
    assert events[-1].finish_reason is FinishReason.CANCELLED
    assert h.status().state is RequestState.CANCELLED
    assert len(events) == 3


def test_unreadable_payload_is_dead_lettered_with_its_reason_and_the_worker_keeps_serving(
    setup: Any, fake_redis: fakeredis.FakeRedis
) -> None:
    client, service, _ = setup
    keys, tag = Keys(), model_tag(MODEL)
    bad = new_request_id(MODEL)
    fake_redis.hset(
        keys.request(bad),
        mapping={
            "payload": '{"model": "m", "prompt": 12',
            "state": "queued",
            "model": MODEL,
            "priority": 50,
        },
    )
    fake_redis.zadd(keys.queue(tag), {bad: 1})
    fake_redis.zadd(keys.queue(tag), {"not-a-valid-id": 2})
    good = client.submit("fine", model=MODEL, max_tokens=2)
    service.run(burst=True)
    result = client.handle(bad).result(timeout=1)
    assert result.finish_reason is FinishReason.ERROR
    assert result.error is not None and "unreadable payload" in result.error
    assert client.handle(bad).status().state is RequestState.DEAD
    assert fake_redis.zscore(keys.dead(tag), bad) is not None
    assert good.result(timeout=1).text == "t0t1"
    assert fake_redis.zcard(keys.queue(tag)) == 0


def test_a_prompt_the_engine_refuses_ends_with_a_clear_error(setup: Any) -> None:
    client, service, engine = setup
    engine.max_prompt_tokens = 3
    h = client.submit("one two three four five", model=MODEL)
    service.run(burst=True)
    result = h.result(timeout=1)
    assert result.finish_reason is FinishReason.ERROR
    assert "over the context" in (result.error or "")


def test_an_error_the_engine_ends_a_request_with_reaches_its_client(setup: Any) -> None:
    client, service, engine = setup
    h = client.submit("p", model=MODEL, max_tokens=5)
    service.iterate()
    engine.failing[h.id] = "guided_regex: cannot be used for constrained decoding"
    service.run(burst=True)
    result = h.result(timeout=1)
    assert (result.text, result.finish_reason) == ("t0", FinishReason.ERROR)
    assert result.error == "guided_regex: cannot be used for constrained decoding"


class TemplateError(Exception):
    """Stands for jinja2's error when a chat template rejects the messages."""


def test_a_chat_template_error_ends_that_request_and_the_worker_keeps_serving(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, service, engine = setup

    def encode_chat(messages: list[dict[str, Any]], *_: object) -> list[int]:
        if messages[0]["content"] == "bad":
            raise TemplateError("Conversation roles must alternate user/assistant")
        return [1, 2]

    monkeypatch.setattr(engine, "encode_chat", encode_chat)
    bad = client.submit(messages=[{"role": "user", "content": "bad"}], model=MODEL, max_tokens=2)
    good = client.submit(messages=[{"role": "user", "content": "ok"}], model=MODEL, max_tokens=2)
    service.run(burst=True)
    failed = bad.result(timeout=1)
    assert failed.finish_reason is FinishReason.ERROR
    assert "roles must alternate" in (failed.error or "")
    assert good.result(timeout=1).text == "t0t1"


def test_a_token_id_prompt_runs_as_given_and_one_outside_the_vocabulary_fails_alone(
    setup: Any,
) -> None:
    client, service, engine = setup
    good = client.submit(prompt_token_ids=[5, 6, 7], model=MODEL, max_tokens=2)
    bad = client.submit(prompt_token_ids=[5, engine.vocab_size], model=MODEL, max_tokens=2)
    service.intake()
    assert engine.running[good.id].prompt_token_ids == [5, 6, 7]
    service.run(burst=True)
    assert good.result(timeout=1).usage.prompt_tokens == 3
    failed = bad.result(timeout=1)
    assert failed.finish_reason is FinishReason.ERROR
    assert "prompt_token_ids[1] is 1000, outside the model's vocabulary" in (failed.error or "")


def test_a_redis_error_while_admitting_holds_nothing_and_the_request_comes_back(
    setup: Any, fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, engine = setup
    settings = Settings(lease_ms=100)
    service = lockstep(WorkerService(engine, fake_redis, settings, MODEL, "w2"))
    h = client.submit("p", model=MODEL, max_tokens=2)
    fake_redis.hset(Keys().request(h.id), "num_generated", 1)  # as if resumed: restore reads
    monkeypatch.setattr(fake_redis, "xrange", _raise_connection_error)
    with pytest.raises(redis.ConnectionError):
        service.intake()
    assert service.ledger.leases() == {}  # no lease kept alive for a request that never runs
    assert engine.added == []
    monkeypatch.undo()
    assert_back_in_the_queue_once_its_lease_lapses(fake_redis, settings, h)


def assert_back_in_the_queue_once_its_lease_lapses(
    fake_redis: fakeredis.FakeRedis, settings: Settings, h: Handle
) -> None:
    time.sleep(settings.lease_ms / 1000 * 1.5)
    reaped = reap_once(fake_redis, Scripts(fake_redis), settings, model_tag(MODEL), "w2")
    assert reaped is not None and reaped.requeued == 1
    assert h.status().state is RequestState.QUEUED


def test_an_engine_gone_at_admission_ends_no_request_and_the_request_comes_back(
    setup: Any, fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, engine = setup
    settings = Settings(lease_ms=100)
    service = lockstep(WorkerService(engine, fake_redis, settings, MODEL, "w2"))
    h = client.submit("p", model=MODEL, max_tokens=2)

    def gone(req: object) -> None:
        raise EngineGone("the engine process exited (code -9)")

    monkeypatch.setattr(engine, "add_request", gone)
    with pytest.raises(EngineGone):
        service.intake()  # not "internal error: at admission" on the request
    assert service.ledger.leases() == {}
    assert_back_in_the_queue_once_its_lease_lapses(fake_redis, settings, h)


def _raise_connection_error(*args: object, **kwargs: object) -> None:
    raise redis.ConnectionError("Connection reset by peer")


def test_a_worker_that_lost_its_lease_publishes_nothing_more(
    setup: Any, fake_redis: fakeredis.FakeRedis
) -> None:
    client, service, _engine = setup
    h = client.submit("p", model=MODEL, max_tokens=10)
    service.iterate()
    service.iterate()  # t0 is written while the engine computes t1
    fake_redis.hset(Keys().request(h.id), "lease_token", "w2:2")  # another worker took it
    service.iterate()
    service.run(burst=True)
    assert fake_redis.xlen(Keys().stream(h.id)) == 1
    assert h.status().state is RequestState.RUNNING
    assert h.id not in service.held


class FlakyPipeline:
    """Runs the commands, then loses the reply: Redis went away mid round trip."""

    def __init__(self, real: Any, failures: list[int]) -> None:
        self.real, self.failures = real, failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        replies = self.real.execute(*args, **kwargs)
        if self.failures:
            self.failures.pop()
            raise redis.ConnectionError("connection reset")
        return replies


def test_a_step_retried_after_a_lost_reply_is_published_exactly_once(
    setup: Any, fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, service, _ = setup
    h = client.submit("p", model=MODEL, max_tokens=4)
    service.iterate()
    failures = [1, 1]
    pipeline = fake_redis.pipeline
    monkeypatch.setattr(
        fake_redis, "pipeline", lambda **kw: FlakyPipeline(pipeline(**kw), failures)
    )
    monkeypatch.setattr("worker.service.Backoff.wait", lambda self: 0.0)
    service.run(burst=True)
    assert failures == []
    indexes = [e.event.index for e in h.stream() if isinstance(e.event, TokenEvent)]
    assert indexes == [0, 1, 2, 3]
    assert h.result(timeout=1).text == "t0t1t2t3"


def test_drain_hands_back_what_it_could_not_finish(setup: Any) -> None:
    client, service, _ = setup
    h = client.submit("p", model=MODEL, max_tokens=1000)
    service.iterate()
    service.stopping.set()
    service.drain(timeout_s=0.0)
    status = h.status()
    assert (status.state, status.position, status.attempts) == (RequestState.QUEUED, 0, 0)
    assert status.num_generated == 1
    assert service.held == {}


def test_a_paused_queue_is_not_claimed(setup: Any, fake_redis: fakeredis.FakeRedis) -> None:
    client, service, _ = setup
    h = client.submit("p", model=MODEL)
    fake_redis.set(Keys().paused(model_tag(MODEL)), 1)
    assert service.intake() == 0
    fake_redis.delete(Keys().paused(model_tag(MODEL)))
    assert service.intake() == 1
    assert h.status().state is RequestState.RUNNING


def test_an_operator_drain_order_stops_claims(setup: Any, fake_redis: fakeredis.FakeRedis) -> None:
    from worker.heartbeat import Heartbeat

    client, service, _ = setup
    heartbeat = Heartbeat(service.queue, service, {"model": MODEL})
    heartbeat.beat()
    assert not service.stopping.is_set()
    assert fake_redis.hget(Keys().worker("w1"), "state") == b"serving"
    fake_redis.set(Keys().worker_control("w1"), "drain")
    heartbeat.beat()
    assert service.stopping.is_set()
    client.submit("p", model=MODEL)
    assert service.intake() == 0


def lapse_and_reap(fake_redis: fakeredis.FakeRedis, settings: Settings, ids: list[str]) -> None:
    """The leases of ``ids`` lapse now, and the reaper runs once."""
    fake_redis.zadd(Keys().leases(model_tag(MODEL)), dict.fromkeys(ids, 0))
    reap_once(fake_redis, Scripts(fake_redis), settings, model_tag(MODEL), "reaper")


def streamed_then_left(client: Client, fake_redis: fakeredis.FakeRedis) -> Handle:
    """A low-priority request a worker streamed a token of, then "died" holding."""
    dying = lockstep(
        WorkerService(ScriptedEngine(max_num_seqs=1), fake_redis, client.settings, MODEL, "w-dead")
    )
    resumed = client.submit("p", model=MODEL, max_tokens=5, priority="low")
    dying.iterate()  # claims it and computes a token
    dying.iterate()  # streams it (while computing another), then "dies" (its lease lapses)
    return resumed


def worker_with_kept_rows(
    fake_redis: fakeredis.FakeRedis, settings: Settings, num_kept: int
) -> WorkerService:
    """A worker of two rows, and ``num_kept`` more kept for resumed requests."""
    engine = ScriptedEngine(max_num_seqs=2, max_num_resumed_seqs=num_kept)
    return lockstep(WorkerService(engine, fake_redis, settings, MODEL, "w1"))


def test_a_request_resumed_after_its_worker_died_is_claimed_by_a_full_worker(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    settings = Settings(publish_coalesce_ms=0)
    serve(fake_redis, MODEL)
    client = Client(connection=fake_redis, settings=settings)
    resumed = streamed_then_left(client, fake_redis)
    busy = worker_with_kept_rows(fake_redis, settings, 1)
    fresh = [client.submit(f"n {i}", model=MODEL, max_tokens=5, priority="high") for i in range(4)]
    busy.iterate()  # full of new work now
    lapse_and_reap(fake_redis, settings, [resumed.id])
    assert resumed.status().position == 0  # ahead of the new, higher-priority work
    busy.iterate()
    assert resumed.status().worker == "w1"
    assert [h.status().state for h in fresh[2:]] == [RequestState.QUEUED] * 2
    busy.run(burst=True)
    events = [e.event for e in resumed.stream() if isinstance(e.event, TokenEvent)]
    assert [e.index for e in events] == [0, 1, 2, 3, 4]


def test_a_full_worker_looks_for_resumed_requests_once_a_poll_not_at_every_step(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """With no room for new work only a resumed request could come of a claim: the
    loop looks every RESUMED_POLL_S, and a request resumed meanwhile comes at the next."""
    settings = Settings(publish_coalesce_ms=0)
    serve(fake_redis, MODEL)
    client = Client(connection=fake_redis, settings=settings)
    resumed = streamed_then_left(client, fake_redis)
    busy = worker_with_kept_rows(fake_redis, settings, 1)
    now = [1_000.0]
    busy.coalescer.clock = lambda: now[0]
    claims: list[int] = []
    claim = busy.queue.claim

    def counted(room: int, free: int, *args: Any) -> Any:
        claims.append(free)
        return claim(room, free, *args)

    busy.queue.claim = counted  # type: ignore[method-assign, assignment]
    for i in range(4):
        client.submit(f"n {i}", model=MODEL, max_tokens=50)
    busy.iterate()  # full of new work now
    assert claims == [2]
    for _ in range(5):
        busy.iterate()
    assert claims == [2, 0]  # one look for resumed work in all those steps
    lapse_and_reap(fake_redis, settings, [resumed.id])
    busy.iterate()
    assert resumed.status().worker is None  # the next look is not due yet
    now[0] += RESUMED_POLL_S
    busy.iterate()
    assert claims == [2, 0, 0]
    assert resumed.status().worker == "w1"


def test_a_claim_waiting_for_its_engine_to_let_go_keeps_its_lease(
    setup: Any, fake_redis: fakeredis.FakeRedis
) -> None:
    """A request this worker handed back while its engine still ran it, and claimed
    again before the engine let go, waits a step for the engine (``Ledger``: WAITING); its new
    lease is renewed meanwhile, so the reaper does not take it from a live worker."""
    from worker.heartbeat import Heartbeat

    client, service, engine = setup
    h = client.submit("p", model=MODEL, max_tokens=5)
    service.iterate()  # claimed, admitted, t0 computed and written
    token = service.held[h.id].lease_token
    service.queue.release({h.id: token})  # back to the queue (a failover cut its tail, say)
    run = service.ledger.in_engine(h.id)
    assert run is not None
    service._drop(run)  # the engine ends this run at its next step
    service.intake()  # claimed again at once, but it waits for the engine
    assert h.id not in service.held and engine.added == [h.id]
    assert h.status().worker == "w1"
    fake_redis.zadd(Keys().leases(model_tag(MODEL)), {h.id: 0})  # the wait outlasts a lease
    Heartbeat(service.queue, service, {"model": MODEL}).beat()
    reap_once(fake_redis, Scripts(fake_redis), service.settings, model_tag(MODEL), "reaper")
    assert h.status().state is RequestState.RUNNING and h.status().worker == "w1"
    service.run(burst=True)
    events = [e.event for e in h.stream() if isinstance(e.event, TokenEvent)]
    assert [s.index for e in events for s in e.split()] == [0, 1, 2, 3, 4]


def test_a_request_whose_lease_lapsed_and_that_its_own_worker_claims_again_runs_once_more(
    setup: Any, fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop stalled past its leases: the reaper put its request back, and the worker
    claims it again before it learns that the run it still holds is lost. The new claim's
    lease is the one renewed (``Ledger``: runs are told apart by lease token), what is
    learned about the lapsed run does not touch the new one, and the client reads one
    whole stream: put back once, started twice."""
    from worker.heartbeat import Heartbeat

    client, service, engine = setup
    add = engine.add_request

    def add_once(req: EngineRequest) -> None:
        assert req.request_id not in engine.running, "two runs of one id in the engine"
        add(req)

    monkeypatch.setattr(engine, "add_request", add_once)
    h = client.submit("p", model=MODEL, max_tokens=6)
    service.iterate()  # claimed, admitted, t0 computed and written
    lapsed = service.held[h.id].lease_token
    lapse_and_reap(fake_redis, service.settings, [h.id])
    heartbeat = Heartbeat(service.queue, service, {"model": MODEL})
    service.intake()  # claims it again while the engine still runs the lapsed run
    assert h.status().attempts == 2 and h.status().worker == "w1"
    heartbeat.beat()  # renews the new claim; finds the lapsed run's lease gone
    leases = Keys().leases(model_tag(MODEL))
    assert (fake_redis.zscore(leases, h.id) or 0) > time.time() * 1000
    service.run(burst=True)
    assert h.status().attempts == 2
    events = [e.event for e in h.stream() if isinstance(e.event, TokenEvent)]
    assert [s.index for e in events for s in e.split()] == [0, 1, 2, 3, 4, 5]
    assert h.result(timeout=1).finish_reason is FinishReason.LENGTH
    assert lapsed != fake_redis.hget(Keys().request(h.id), "lease_token")
    assert engine.added == [h.id, h.id]


def test_a_full_worker_takes_every_stream_cut_mid_answer_before_unstarted_work(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """A dead worker held streams mid-answer and urgent requests it had not started yet.
    A busy worker's rows kept for resumed streams go to the streams a reader is waiting
    on; the unstarted requests wait among new work (they showed nobody anything)."""
    settings = Settings(publish_coalesce_ms=0)  # each step's token is written at once
    serve(fake_redis, MODEL)
    client = Client(connection=fake_redis, settings=settings)
    dying = lockstep(
        WorkerService(ScriptedEngine(max_num_seqs=4), fake_redis, settings, MODEL, "w-dead")
    )
    mid_answer = [
        client.submit(f"m {i}", model=MODEL, max_tokens=5, priority="low") for i in (0, 1)
    ]
    dying.iterate()  # claims both and computes a token of each
    dying.iterate()  # streams them (while computing the next)
    unstarted = [
        client.submit(f"u {i}", model=MODEL, max_tokens=5, priority="high") for i in (0, 1)
    ]
    assert dying.intake() == 2  # claimed, then it "dies" before its next step
    busy = worker_with_kept_rows(fake_redis, settings, 2)
    for i in (0, 1):
        client.submit(f"n {i}", model=MODEL, max_tokens=5)
    busy.iterate()  # full of new work now
    lapse_and_reap(fake_redis, settings, [h.id for h in [*mid_answer, *unstarted]])
    busy.iterate()
    assert [h.status().worker for h in mid_answer] == ["w1", "w1"]
    assert [h.status().position for h in unstarted] == [0, 1]


def test_a_lease_that_a_finish_in_flight_dropped_is_not_taken_for_lost(
    setup: Any, fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat renews while a write that ends a request is in flight: the lease
    it finds gone is that finish's doing, not another worker's."""
    from worker.heartbeat import Heartbeat

    client, service, engine = setup
    done = client.submit("a", model=MODEL, max_tokens=1)
    client.submit("b", model=MODEL, max_tokens=5)
    service.iterate()  # done's only token and its final event are held
    heartbeat = Heartbeat(service.queue, service, {"model": MODEL})
    step: Callable[[], list[RequestOutput]] = engine.step
    leases = Keys().leases(model_tag(MODEL))

    def step_while_the_finish_is_written() -> list[RequestOutput]:
        give_up = time.monotonic() + 5
        while fake_redis.zscore(leases, done.id) is not None and time.monotonic() < give_up:
            time.sleep(0.001)
        heartbeat.beat()  # the finish has gone through; its reply is not applied yet
        return step()

    monkeypatch.setattr(engine, "step", step_while_the_finish_is_written)
    service.iterate()
    assert service.ledger.take_news() == []  # no lease taken for lost
    assert done.id not in service.held
    assert done.result(timeout=1).finish_reason is FinishReason.LENGTH


def sent_scripts(service: WorkerService) -> list[list[str]]:
    """The scripts of each round trip ``service``'s loop sends from now on."""
    rounds: list[list[str]] = []
    send = service.queue.scripts.send

    def recorded(commands: Any, confirm: Any = None) -> Any:
        rounds.append([c.script for c in commands if hasattr(c, "script")])
        return send(commands, confirm)

    service.queue.scripts.send = recorded  # type: ignore[method-assign]
    return rounds


def test_what_a_write_ended_is_settled_by_the_next_write_not_a_round_trip_of_its_own(
    setup: Any,
) -> None:
    """A request that ends while another runs is settled on the model's slot (lease
    dropped, history filed, usage counted) by the next write, in its round trip; the
    last one, once the engine is idle, at once."""
    client, service, _ = setup
    short = client.submit("a b", model=MODEL, max_tokens=2)
    long = client.submit("c d", model=MODEL, max_tokens=5)
    rounds = sent_scripts(service)
    leases = client.keys.leases(model_tag(MODEL))
    while short.status().state is not RequestState.FINISHED:
        service.iterate()
    assert client.redis.zscore(leases, short.id) is not None  # not settled yet
    service.iterate()
    assert client.redis.zscore(leases, short.id) is None
    assert client.redis.zscore(leases, long.id) is not None
    service.run(burst=True)
    assert long.result(timeout=1).finish_reason is FinishReason.LENGTH
    writes = [r for r in rounds if "publish" in r]
    # The short one's second token ends it in the second write; the third settles it.
    assert writes[:3] == [["publish"], ["publish"], ["settle", "usage", "publish"]]
    assert ["settle", "usage"] in rounds[rounds.index(writes[-1]) :]  # the last: at once
    assert sum(r == ["settle", "usage"] for r in rounds) == 1
    assert client.redis.zcard(leases) == 0
    (row,) = read_usage(client.redis, client.keys, last_hours(1))
    assert row.requests == 2
    assert client.redis.zcard(client.keys.recent(model_tag(MODEL))) == 2


def test_what_ended_is_settled_alone_when_no_write_is_coming(setup: Any) -> None:
    """A step that produced nothing (the others' prompts still prefilling) leaves no
    write to carry what the last write ended: it is settled in a round trip of its own."""
    client, service, engine = setup
    short = client.submit("a b", model=MODEL, max_tokens=1)
    long = client.submit("c d", model=MODEL, max_tokens=5)
    service.iterate()  # claimed; the first step ends the short one
    engine.step = lambda: []
    rounds = sent_scripts(service)
    service.iterate()  # its final written, beside a step that produced nothing
    assert short.status().state is RequestState.FINISHED
    leases = client.keys.leases(model_tag(MODEL))
    assert client.redis.zscore(leases, short.id) is not None
    service.iterate()
    assert rounds[-1] == ["settle", "usage"]
    assert client.redis.zscore(leases, short.id) is None
    assert client.redis.zscore(leases, long.id) is not None
