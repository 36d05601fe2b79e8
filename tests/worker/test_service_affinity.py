"""The worker's side of prefix affinity, against fakeredis and a scripted engine: its
heartbeat publishes the fingerprints its engine holds warm (gone when it stops, or with
the switch off), and its claims take and count warm matches."""

from __future__ import annotations

import fakeredis

from producer.client import Client
from shared.keys import Keys, model_tag
from shared.replies import text
from shared.settings import Settings
from tests.conftest import serve
from tests.worker.fakes import ScriptedEngine
from worker.heartbeat import Heartbeat
from worker.service import WorkerService

MODEL = "m"
TAG = model_tag(MODEL)
KEYS = Keys()


class WarmEngine(ScriptedEngine):
    def __init__(self, warm: list[str]) -> None:
        super().__init__()
        self.warm = warm

    def warm_fingerprints(self, limit: int) -> list[str]:
        return self.warm[:limit]


def service_with(
    fake_redis: fakeredis.FakeRedis, engine: ScriptedEngine, **kw: object
) -> WorkerService:
    settings = Settings(publish_coalesce_ms=0, **kw)  # type: ignore[arg-type]
    return WorkerService(engine, fake_redis, settings, MODEL, "w1")


def test_the_heartbeat_publishes_the_warm_set_and_claims_take_warm_matches(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    serve(fake_redis, MODEL)
    client = Client(connection=fake_redis, settings=Settings())
    system = {"role": "system", "content": "You answer about tides. " * 30}
    cold = client.submit(messages=[{"role": "system", "content": "other"},
                                   {"role": "user", "content": "q"}], model=MODEL)  # fmt: skip
    hot = client.submit(messages=[system, {"role": "user", "content": "q"}], model=MODEL)
    fingerprint = text(fake_redis.hget(KEYS.prefixes(TAG), hot.id) or b"").split()[0]
    engine = WarmEngine([fingerprint])
    engine.max_num_seqs = 1
    service = service_with(fake_redis, engine)
    heartbeat = Heartbeat(service.queue, service, {"model": MODEL})
    heartbeat.beat()
    assert fake_redis.smembers(KEYS.warm(TAG, "w1")) == {fingerprint.encode()}
    assert 0 < fake_redis.pttl(KEYS.warm(TAG, "w1")) <= service.settings.lease_ms
    assert service.intake() == 1
    assert list(service.held) == [hot.id]
    heartbeat.beat()
    assert fake_redis.hget(KEYS.worker("w1"), "affinity_claims") == b"1"
    assert service.metrics.num_affinity_claims == 1
    service.queue.deregister()  # what the heartbeat does as the worker stops
    assert not fake_redis.exists(KEYS.warm(TAG, "w1"))
    assert cold.position() == 0


def test_with_affinity_off_nothing_is_published_and_claims_follow_the_queue(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    serve(fake_redis, MODEL)
    client = Client(connection=fake_redis, settings=Settings())
    first = client.submit("first", model=MODEL)
    client.submit("second", model=MODEL)
    engine = WarmEngine(["0123456789abcdef"])
    engine.max_num_seqs = 1
    service = service_with(fake_redis, engine, prefix_affinity=False)
    Heartbeat(service.queue, service, {"model": MODEL}).beat()
    assert not fake_redis.exists(KEYS.warm(TAG, "w1"))
    assert service.intake() == 1 and list(service.held) == [first.id]
