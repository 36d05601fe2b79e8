"""Fair shares between tenants with several simulated workers on a real redis-server:
a newcomer is not stuck behind a backlog, weights share service 3:1, a high priority
request goes first, and usage per tenant adds up to what the requests were told."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from producer.cli import app
from producer.client import Client, Handle
from producer.embedded import EmbeddedRedis
from shared.keys import Keys
from shared.replies import text
from shared.settings import Settings
from shared.usage import last_hours, read_usage, totals
from tests.conftest import as_tenant, serve
from tests.integration.faults import wait_until
from worker.sim_fleet import sim_fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SIM = "sim:step_ms=4,knee=8,max_num_seqs=8"
NUM_WORKERS = 4


@pytest.fixture
def client(redis_server: EmbeddedRedis, real_redis: redis.Redis) -> Iterator[Client]:
    serve(real_redis, SIM)
    settings = Settings(redis_url=redis_server.url, max_queued=5000)
    with Client(settings=settings) as c:
        yield c


def submit(client: Client, tenant: str, n: int, weight: float = 1.0, **kw: Any) -> list[Handle]:
    max_tokens = kw.pop("max_tokens", 4)
    body = {"model": SIM, "prompt": "a b c d", **kw}
    body["sampling"] = {"max_tokens": max_tokens}
    return as_tenant(client, tenant, weight).submit_many([dict(body) for _ in range(n)])


def times(client: Client, handles: list[Handle], field: str) -> list[int]:
    pipe = client.redis.pipeline(transaction=False)
    for h in handles:
        pipe.hget(client.keys.request(h.id), field)
    return [int(text(v)) for v in pipe.execute() if v is not None]


def all_ended(client: Client, handles: list[Handle]) -> bool:
    return len(times(client, handles, "finished_ms")) == len(handles)


def test_twenty_requests_of_b_all_start_before_a_hundred_of_a_finish(
    client: Client, redis_server: EmbeddedRedis
) -> None:
    with sim_fleet(redis_server.url, SIM, NUM_WORKERS, client.settings):
        a = submit(client, "a", 1000)
        b = submit(client, "b", 20)
        wait_until(lambda: all_ended(client, b), 120, "b's requests to end")
        wait_until(lambda: len(times(client, a, "finished_ms")) >= 100, 120, "100 of a's")
        b_last_start = max(times(client, b, "started_ms"))
        a_hundredth_end = sorted(times(client, a, "finished_ms"))[99]
        for h in a:  # leave no backlog running past the test
            h.cancel()
    assert b_last_start <= a_hundredth_end, (b_last_start, a_hundredth_end)


def test_weights_3_to_1_share_service_within_15_percent_and_high_goes_first(
    client: Client, redis_server: EmbeddedRedis
) -> None:
    a = submit(client, "a", 400, weight=3)
    b = submit(client, "b", 400, weight=1)
    with sim_fleet(redis_server.url, SIM, NUM_WORKERS, client.settings):
        wait_until(lambda: len(times(client, a + b, "started_ms")) >= 60, 60, "work to start")
        (high,) = submit(client, "c", 1, priority="high")
        wait_until(lambda: all_ended(client, [high]), 60, "the high request")
        high_start = times(client, [high], "started_ms")[0]
        high_created = times(client, [high], "created_ms")[0]
        wait_until(lambda: len(times(client, a + b, "finished_ms")) >= 300, 120, "300 ended")
        started_a, started_b = times(client, a, "started_ms"), times(client, b, "started_ms")
        for h in a + b:
            h.cancel()
    # While both are backlogged, the service (tokens; every request here is alike) that
    # each got in the first 300 starts.
    window = sorted([(t, "a") for t in started_a] + [(t, "b") for t in started_b])[:300]
    num_a = sum(1 for _, who in window if who == "a")
    ratio = num_a / (len(window) - num_a)
    assert ratio == pytest.approx(3.0, rel=0.15), ratio
    # Normal work still queued when it came starts after it: only what workers had
    # already picked (at most the fleet's rows) starts between its submit and its start.
    normal = started_a + started_b
    assert len([t for t in normal if high_created < t < high_start]) <= NUM_WORKERS * 8
    assert len([t for t in normal if t > high_start]) > 100


def test_usage_per_tenant_equals_the_sum_of_its_requests_usage(
    client: Client, redis_server: EmbeddedRedis
) -> None:
    handles = {
        "acme": submit(client, "acme", 7, max_tokens=5) + submit(client, "acme", 3, max_tokens=9),
        "beta": submit(client, "beta", 4, max_tokens=2, prompt="one two three four five six"),
    }
    with sim_fleet(redis_server.url, SIM, 2, client.settings):
        results = {t: [h.result(timeout=60) for h in hs] for t, hs in handles.items()}
    rows = read_usage(client.redis, Keys(), last_hours(2))
    recorded = {u.tenant: u for u in totals(rows)}
    for tenant, rs in results.items():
        u = recorded[tenant]
        assert u.prompt_tokens == sum(r.usage.prompt_tokens for r in rs)
        assert u.completion_tokens == sum(r.usage.completion_tokens for r in rs)
        assert u.requests == len(rs)
    shown = CliRunner().invoke(app, ["usage", "--redis", redis_server.url, "--hours", "2"])
    assert shown.exit_code == 0, shown.output
    acme = recorded["acme"]
    assert "acme" in shown.output and f"{acme.completion_tokens:,}" in shown.output
