from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from producer.gateway.metrics import priority_band
from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL


def test_priority_bands_keep_label_values_few() -> None:
    assert [priority_band(p) for p in (0, 24, 25, 60, 75, 99, 100)] == [
        "lowest",
        "lowest",
        "low",
        "normal",
        "high",
        "high",
        "critical",
    ]


def test_a_finished_request_shows_in_vllm_named_metrics(gateway: RunningGateway) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "priority": 80}
    with gateway.client() as http:
        assert http.post("/v1/chat/completions", json=chat).status_code == 200
        assert http.post("/v1/chat/completions", json={**chat, "model": "x"}).status_code == 404
        text = http.get("/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    labels = (("model", MODEL), ("priority", "high"))
    assert samples[("tokenq:request_success_total", (("finished_reason", "stop"), *labels))] == 1
    assert samples[("tokenq:time_to_first_token_seconds_count", labels)] == 1
    assert samples[("tokenq:generation_tokens_total", labels)] == gateway.worker.num_tokens
    assert samples[("tokenq:gateway_requests_total", (("api", "chat"), *labels))] == 1
    rejected = (("status", "404"), ("type", "not_found_error"))
    assert samples[("tokenq:gateway_rejected_total", rejected)] == 1


def test_queue_depth_per_model_and_priority_is_exported_for_autoscalers(
    gateway: RunningGateway,
) -> None:
    from producer.client import Client
    from tests.conftest import serve

    gateway.worker.stop()  # nothing claims: the requests stay queued
    serve(gateway.redis, "queued-model")  # a model some worker serves (now busy elsewhere)
    client = Client(connection=gateway.redis)
    for priority in ("low", "low", "critical", 60):
        client.submit("wait", model="queued-model", priority=priority)
    with gateway.client() as http:
        text = http.get("/metrics").text
    depth = {
        s.labels["priority"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tokenq:queue_depth" and s.labels["model"] == "queued-model"
    }
    assert depth == {"low": 2, "critical": 1, "60": 1}
