"""Redis fails over under load and nothing accepted is lost: a real primary with replicas
behind three sentinels, and a real Redis Cluster with replicas, on loopback; simulated
workers; a client that keeps submitting and reads every accepted stream live.

Each test SIGKILLs a primary mid-run, lets Sentinel (or the cluster) promote a replica,
and checks what clients saw: every accepted request finished once, every stream on the
new primary and every live read of it whole (no gap, no repeat, the tokens of an
uninterrupted run), and reports the longest silence a reader saw."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import redis

from producer.client import Client
from shared.connection import close, connect
from shared.errors import ReplicationTimeout
from shared.keys import Keys, model_tag
from tests.cluster import LocalCluster
from tests.integration.failover import (
    SIM_MODEL,
    Load,
    Outcome,
    audit,
    settings_for,
    sim_workers,
)
from tests.integration.faults import wait_until
from tests.producer.gateway.process import gateway_process
from tests.producer.gateway.sse_client import messages
from tests.sentinel import LocalSentinel

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NUM_WORKERS = 2
TOTAL, MAX_TOKENS, PER_S = 80, 32, 20.0


def report(capsys: pytest.CaptureFixture[str], **figures: object) -> None:
    with capsys.disabled():
        print("\nFAILOVER REPORT " + json.dumps(figures))


def _workers_up(connection: redis.Redis, n: int) -> None:
    wait_until(lambda: connection.zcard(Keys().workers()) >= n, 120, f"{n} workers")


def _run_sentinel(local: LocalSentinel, min_replicas: int, log_dir: Path) -> tuple[Outcome, float]:
    """The load across a primary's SIGKILL; the outcome and the failover's own time."""
    connection = connect(local.url)
    client = Client(connection=connection, settings=settings_for(local.url, min_replicas))
    env = {"TOKENQ_REDIS_MIN_REPLICAS": str(min_replicas)}
    with sim_workers(local.url, NUM_WORKERS, env, log_dir):
        _workers_up(connection, NUM_WORKERS)
        load = Load(client, TOTAL, MAX_TOKENS, PER_S).start()
        wait_until(lambda: len(load.accepted) >= TOTAL // 3, 60, "a third of the load")
        old = local.primary_port()
        killed = time.monotonic()
        local.kill(old)
        local.wait_for_failover(old)
        failover_s = time.monotonic() - killed
        load.wait(180)
        outcome = audit(load, connection)
    client.close()
    return outcome, failover_s


def test_a_primary_killed_under_load_loses_nothing_with_one_replica_required(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = LocalSentinel(num_replicas=2).start()  # one left to confirm writes after
    try:
        outcome, failover_s = _run_sentinel(local, 1, tmp_path)
    finally:
        local.stop()
    report(capsys, test="sentinel", min_replicas=1, failover_s=round(failover_s, 2),
           **outcome.report())  # fmt: skip
    assert outcome.accepted == TOTAL
    assert (outcome.lost, outcome.finished_twice) == ([], [])
    assert (outcome.bad_streams, outcome.bad_reads) == ([], [])


def test_a_primary_killed_with_no_replica_required_reports_what_it_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replication is asynchronous: what the primary acknowledged in its last moments may
    never reach the replica. Measured, so the deploy README's statement is."""
    local = LocalSentinel(num_replicas=1).start()
    try:
        outcome, failover_s = _run_sentinel(local, 0, tmp_path)
    finally:
        local.stop()
    report(capsys, test="sentinel", min_replicas=0, failover_s=round(failover_s, 2),
           **outcome.report())  # fmt: skip
    assert outcome.accepted == TOTAL
    assert outcome.finished_twice == []
    # What finished is whole, on the new primary and for every reader of it.
    assert outcome.bad_streams == []
    lost = set(outcome.lost)
    assert [r for r in outcome.bad_reads if r.split(":")[0] not in lost] == []


def test_a_cluster_master_killed_under_load_loses_nothing_with_one_replica_required(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = LocalCluster(num_replicas=2, node_timeout_ms=1000).start()
    try:
        connection = connect(cluster.url)
        client = Client(connection=connection, settings=settings_for(cluster.url, 1))
        queue = Keys().queue(model_tag(SIM_MODEL))  # its master holds the model's queue
        with sim_workers(cluster.url, NUM_WORKERS, {"TOKENQ_REDIS_MIN_REPLICAS": "1"}, tmp_path):
            _workers_up(connection, NUM_WORKERS)
            load = Load(client, TOTAL, MAX_TOKENS, PER_S).start()
            wait_until(lambda: len(load.accepted) >= TOTAL // 3, 60, "a third of the load")
            dead = cluster.master_of(queue)
            killed = time.monotonic()
            cluster.kill(dead)
            cluster.wait_for_failover(dead, queue)
            failover_s = time.monotonic() - killed
            load.wait(180)
            outcome = audit(load, connection)
        client.close()
        close(connection)
    finally:
        cluster.stop()
    report(capsys, test="cluster", min_replicas=1, failover_s=round(failover_s, 2),
           **outcome.report())  # fmt: skip
    assert outcome.accepted == TOTAL
    assert (outcome.lost, outcome.finished_twice) == ([], [])
    assert (outcome.bad_streams, outcome.bad_reads) == ([], [])
    # Each worker said so once: the promoted replica's address, the dead master's.
    said = [_failover_lines(log) for log in sorted(tmp_path.glob("worker-*.log"))]
    assert said and all(len(lines) == 1 and f":{dead}" in lines[0] for lines in said), said


def _failover_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "Redis Cluster failed over" in line]


def test_with_its_replica_killed_a_submit_fails_clearly_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    local = LocalSentinel(num_replicas=1).start()
    try:
        connection = connect(local.url)
        settings = settings_for(local.url, 1).model_copy(update={"redis_replica_timeout_ms": 300})
        client = Client(connection=connection, settings=settings)
        with sim_workers(local.url, 1, {"TOKENQ_REDIS_MIN_REPLICAS": "1"}, tmp_path):
            _workers_up(connection, 1)
            done = client.submit("before", model=SIM_MODEL, max_tokens=4).result(timeout=30)
            assert done.text
            local.kill(local.data_ports[1])
            before = set(connection.keys("tokenq:{*}:req:*"))
            started = time.monotonic()
            with pytest.raises(ReplicationTimeout, match="only 0 of the 1 Redis replica"):
                client.submit("after", model=SIM_MODEL, max_tokens=4, idempotency_key="k")
            assert time.monotonic() - started >= 0.3
            assert set(connection.keys("tokenq:{*}:req:*")) == before
            assert connection.zcard(Keys().queue(model_tag(SIM_MODEL))) == 0
            assert connection.keys("tokenq:{*}:idem:*") == []
        client.close()
    finally:
        local.stop()


def test_a_completion_streamed_through_a_gateway_rides_through_a_failover(
    tmp_path: Path,
) -> None:
    """A gateway and a worker reached through Sentinel: a completion streaming over SSE
    when the primary dies goes on from the new one, every token once."""
    local = LocalSentinel(num_replicas=2).start()
    try:
        env = {"TOKENQ_REDIS_MIN_REPLICAS": "1"}
        with sim_workers(local.url, 1, env, tmp_path), gateway_process(local.url, **env) as url:
            connection = connect(local.url)
            _workers_up(connection, 1)
            request = {"model": SIM_MODEL, "prompt": "Once", "max_tokens": 150, "stream": True}
            texts: list[str] = []
            with (
                httpx.Client(base_url=url, timeout=60) as http,
                http.stream("POST", "/v1/completions", json=request) as response,
            ):
                for message in messages(response):
                    if message.data == "[DONE]":
                        break
                    texts.append(json.loads(message.data)["choices"][0]["text"])
                    if len(texts) == 20:  # mid-answer
                        old = local.primary_port()
                        local.kill(old)
            assert "".join(texts) == "".join(f"sim{i} " for i in range(150))
            assert local.primary_port() != old
    finally:
        local.stop()
