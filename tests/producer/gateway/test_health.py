from __future__ import annotations

import httpx

from producer.embedded import EmbeddedRedis, free_port
from producer.gateway.app import create_app
from producer.gateway.config import GatewayConfig, parse_api_keys
from shared.settings import Settings
from tests.producer.gateway.conftest import RunningGateway, ThreadedServer


def test_healthz_readyz_and_metrics(gateway: RunningGateway) -> None:
    with gateway.client() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").json() == {"status": "ready"}
        metrics = http.get("/metrics")
    assert metrics.status_code == 200
    assert "tokenq:gateway_open_streams" in metrics.text


def test_without_redis_readyz_and_submits_answer_503(redis_server: EmbeddedRedis) -> None:
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    app = create_app(settings, GatewayConfig(api_keys=parse_api_keys("")))
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with ThreadedServer(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        assert http.get("/healthz").status_code == 200
        ready = http.get("/readyz")
        submit = http.post("/v1/chat/completions", json=chat)
    assert (ready.status_code, submit.status_code) == (503, 503)
    assert submit.json()["error"]["code"] == "redis_unavailable"
