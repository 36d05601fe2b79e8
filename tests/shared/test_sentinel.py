"""Sentinel URLs, and connections that find a new primary by themselves after a real
failover (a primary with two replicas and three sentinels on loopback)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import redis

from producer.client import Client
from shared.connection import connect, connect_async, shown_url
from shared.errors import InvalidRequest, ReplicationTimeout
from shared.models import FinishReason
from shared.replication import Confirm, Replicas
from shared.scripts import Scripts
from shared.sentinel import parse_sentinel_url
from shared.settings import DEFAULT_MODEL, Settings
from tests.conftest import serve
from tests.sentinel import LocalSentinel


def test_a_sentinel_url_names_its_sentinels_service_database_and_credentials() -> None:
    url = "redis+sentinel://app:pw@10.0.0.1:26379,[::1]:26380/orders/3?sentinel_password=sp"
    parsed = parse_sentinel_url(url)
    assert parsed.sentinels == [("10.0.0.1", 26379), ("::1", 26380)]
    assert (parsed.service, parsed.tls) == ("orders", False)
    assert (parsed.options["db"], parsed.options["username"], parsed.options["password"]) == (
        3, "app", "pw",
    )  # fmt: skip
    assert parsed.sentinel_options == {"password": "sp"}
    assert "pw" not in shown_url(url) and "sp" not in shown_url(url)


def test_rediss_sentinel_uses_tls_to_the_sentinels_and_the_primary() -> None:
    parsed = parse_sentinel_url("rediss+sentinel://s1:26379/orders?ssl_cert_reqs=none")
    assert parsed.tls and parsed.sentinel_options["ssl"] is True
    assert parsed.options["ssl_cert_reqs"] == parsed.sentinel_options["ssl_cert_reqs"] == "none"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://s1:26379", "SERVICE_NAME"),
        ("redis+sentinel://s1/orders", "'s1' in"),
        ("redis+sentinel://s1:port/orders", "is not HOST:PORT"),
    ],
)
def test_a_bad_sentinel_url_says_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        connect(url)


def test_a_sentinel_url_with_the_cluster_setting_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="not a Redis Cluster"):
        connect("redis+sentinel://s1:26379/orders", cluster=True)


@pytest.fixture
def sentinel() -> Iterator[LocalSentinel]:
    local = LocalSentinel(num_replicas=2).start()
    yield local
    local.stop()


@pytest.mark.integration
def test_clients_follow_a_failover_and_say_so_once(
    sentinel: LocalSentinel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tokenq.redis")
    connection = connect(sentinel.url)
    serve(connection, DEFAULT_MODEL)
    client = Client(connection=connection, settings=Settings(redis_url=sentinel.url))
    handle = client.submit("before the failover")
    old = sentinel.primary_port()
    sentinel.kill(old)
    new = sentinel.wait_for_failover(old)
    assert handle.status().position == 0  # the new primary has it; found by the client
    assert connection.connection_pool.get_master_address()[1] == new  # type: ignore[attr-defined]
    later = [connect(sentinel.url).ping() for _ in range(3)]  # more connections, no more lines
    assert later == [True, True, True]
    failovers = [r for r in caplog.records if "failed over" in r.getMessage()]
    assert len(failovers) == 1, [r.getMessage() for r in caplog.records]
    assert f"is now 127.0.0.1:{new} (was 127.0.0.1:{old})" in failovers[0].getMessage()


@pytest.mark.integration
async def test_an_asyncio_client_follows_a_failover(sentinel: LocalSentinel) -> None:
    connection = connect_async(sentinel.url)
    try:
        await connection.set("k", "v")
        old = sentinel.primary_port()
        sentinel.kill(old)
        sentinel.wait_for_failover(old)
        assert await connection.get("k") == b"v"
    finally:
        await connection.aclose()


@pytest.mark.integration
def test_a_write_waits_for_its_replicas_and_says_when_they_fall_short(
    sentinel: LocalSentinel,
) -> None:
    connection = connect(sentinel.url)
    scripts = Scripts(connection, Replicas(wanted=2, timeout_ms=300))
    assert scripts.send([("SET", "a", 1)], Confirm(["a"], "a test write")) == [True]
    replica = sentinel.data_ports[1]
    sentinel.kill(replica)
    started = time.monotonic()
    with pytest.raises(ReplicationTimeout, match="a test write: only 1 of the 2") as refused:
        scripts.send([("SET", "a", 2)], Confirm(["a"], "a test write"))
    assert time.monotonic() - started >= 0.3
    assert "TOKENQ_REDIS_MIN_REPLICAS" in str(refused.value)
    assert scripts.send([("SET", "a", 3)]) == [True]  # unconfirmed writes go on


@pytest.mark.integration
def test_a_write_waits_for_every_replica_online_not_only_the_ones_wanted(
    sentinel: LocalSentinel,
) -> None:
    """Sentinel may promote either replica (by offsets in INFO replies that can be
    seconds old), so a write waits for both, though one is all it requires."""
    connection = connect(sentinel.url)
    scripts = Scripts(connection, Replicas(wanted=1, timeout_ms=400))
    assert scripts.send([("SET", "a", 1)], Confirm(["a"], "a test write")) == [True]
    with sentinel.paused(sentinel.data_ports[2]):
        waited_s = []
        for value in range(2, 6):
            started = time.monotonic()
            assert scripts.send([("SET", "a", value)], Confirm(["a"], "a test write")) == [True]
            waited_s.append(time.monotonic() - started)
    assert waited_s[0] >= 0.4  # the stopped replica was waited for, to the timeout
    # ... and once it has fallen behind, no longer: the rest wait for the one keeping up.
    assert max(waited_s[2:]) < 0.4, waited_s
    assert redis.Redis(port=sentinel.data_ports[1]).get("a") == b"5"


@pytest.mark.integration
def test_a_submit_its_replicas_do_not_confirm_fails_and_leaves_nothing_behind(
    sentinel: LocalSentinel,
) -> None:
    for port in sentinel.data_ports[1:]:
        sentinel.kill(port)
    connection = connect(sentinel.url)
    serve(connection, DEFAULT_MODEL)
    settings = Settings(redis_url=sentinel.url, redis_min_replicas=1, redis_replica_timeout_ms=200)
    client = Client(connection=connection, settings=settings)
    with pytest.raises(ReplicationTimeout, match="the submit of 2 request"):
        client.submit_many(
            [
                {"model": DEFAULT_MODEL, "prompt": "a", "idempotency_key": "k-1"},
                {"model": DEFAULT_MODEL, "prompt": "b"},
            ]
        )
    keys = [k.decode() for k in connection.scan_iter(match="tokenq:*")]
    assert [k for k in keys if ":req:" in k or ":idem:" in k or k.endswith(":queue")] == []
    # Not half-accepted: the same idempotency key submits anew once a replica is back.
    unconfirmed = Client(connection=connection, settings=Settings(redis_url=sentinel.url))
    again = unconfirmed.submit("a", idempotency_key="k-1")
    assert again.status().position == 0
    assert again.cancel() == "cancelled"
    assert again.result(timeout=5).finish_reason is FinishReason.CANCELLED


def test_no_replicas_wanted_sends_no_wait(real_redis: redis.Redis) -> None:
    scripts = Scripts(real_redis, Replicas(wanted=0))
    real_redis.config_resetstat()
    scripts.send([("SET", "a", 1)], Confirm(["a"], "x"))
    assert "cmdstat_wait" not in real_redis.info("commandstats")
