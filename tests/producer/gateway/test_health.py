from __future__ import annotations

import httpx

from producer.api_keys import parse_api_keys
from producer.embedded import EmbeddedRedis, free_port
from producer.gateway.app import create_app
from producer.gateway.config import GatewayConfig
from shared.settings import Settings
from tests.producer.gateway.conftest import RunningGateway, ThreadedServer


def test_healthz_readyz_and_metrics(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").json() == {"status": "ready"}
        assert http.get("/health").json() == {"status": "ready"}  # vLLM's probe path
        metrics = http.get("/metrics")
    assert metrics.status_code == 200
    assert "tokenq:gateway_open_streams" in metrics.text


def test_without_redis_readyz_and_submits_answer_503(redis_server: EmbeddedRedis) -> None:
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    app = create_app(settings, GatewayConfig(api_keys=parse_api_keys("")))
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with ThreadedServer(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        assert http.get("/healthz").status_code == 200
        ready, health = http.get("/readyz"), http.get("/health")
        submit = http.post("/v1/chat/completions", json=chat)
    assert (ready.status_code, health.status_code, submit.status_code) == (503, 503, 503)
    assert submit.json()["error"]["code"] == "redis_unavailable"


def test_a_submit_no_replica_confirms_answers_503_and_leaves_nothing(
    redis_server: EmbeddedRedis,
) -> None:
    """TOKENQ_REDIS_MIN_REPLICAS=1 on a Redis with no replica: a submit is not accepted,
    and says why; the client may retry it as it is."""
    import redis

    from tests.conftest import serve

    connection = redis.Redis.from_url(redis_server.url)
    connection.flushall()
    serve(connection, "m")
    settings = Settings(
        redis_url=redis_server.url, redis_min_replicas=1, redis_replica_timeout_ms=100
    )
    app = create_app(settings, GatewayConfig(api_keys=parse_api_keys("")))
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with ThreadedServer(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        submit = http.post("/v1/chat/completions", json=chat)
    assert submit.status_code == 503 and submit.headers["Retry-After"] == "1"
    error = submit.json()["error"]
    assert error["code"] == "replication_timeout"
    assert "only 0 of the 1 Redis replica" in error["message"]
    assert [k for k in connection.scan_iter("tokenq:*") if b":req:" in k] == []
    connection.close()
