"""Run as ``python -m tests.integration.untraced_run REDIS_URL``: requests with a
traceparent through the Python client and the gateway (in this process), served by a
worker loop on the simulated engine. Prints, as JSON, the OpenTelemetry SDK's tracing
modules this process imported (none with tracing off) and the traceparents the
requests' records carry."""

from __future__ import annotations

import sys

import orjson
from fastapi.testclient import TestClient

from producer import Client
from producer.gateway.app import create_app
from shared.connection import connect
from shared.keys import Keys
from shared.settings import Settings
from worker.service import WorkerService
from worker.sim import SimConfig, SimEngine

MODEL = "sim:"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# The SDK's tracing and its exporters. (The OpenTelemetry API, and the SDK's metrics,
# are imported by redis-py and FastAPI themselves where they are installed.)
TRACING_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter")


def main(redis_url: str) -> None:
    settings = Settings(redis_url=redis_url, require_known_model=False)
    connection = connect(redis_url)
    with Client(settings=settings) as client, TestClient(create_app(settings)) as http:
        handle = client.submit("hi", model=MODEL, max_tokens=3, traceparent=TRACEPARENT)
        body = {"model": MODEL, "prompt": "hi", "sampling": {"max_tokens": 3}}
        reply = http.post("/v1/requests", json=body, headers={"traceparent": TRACEPARENT})
        assert reply.status_code == 202, reply.text
        worker = WorkerService(SimEngine(SimConfig(step_ms=1)), connection, settings, MODEL, "w1")
        worker.run(burst=True)
        worker.close()
        events = http.get(f"/v1/requests/{reply.json()['id']}/events").text
        assert "final" in events and handle.result(10).usage.completion_tokens == 3
        ids = (handle.id, reply.json()["id"])
    keys = Keys(settings.namespace)
    payloads = [connection.hget(keys.request(i), "payload") for i in ids]
    traceparents = [orjson.loads(p or b"{}").get("traceparent") for p in payloads]
    modules = sorted(m for m in sys.modules if m.startswith(TRACING_MODULES))
    print(orjson.dumps({"modules": modules, "traceparents": traceparents}).decode())


if __name__ == "__main__":
    main(sys.argv[1])
