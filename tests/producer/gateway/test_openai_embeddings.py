"""``/v1/embeddings`` checks made at the gateway, over HTTP against a real uvicorn."""

from __future__ import annotations

from producer.openai.embeddings import EmbeddingRequest
from producer.openai.schemas import ChatCompletionRequest, CompletionRequest, QueueFields
from shared.keys import Keys, model_tag
from tests.producer.gateway.conftest import RunningGateway
from tests.producer.gateway.scripted import MODEL


def test_dimensions_above_the_models_embedding_size_get_400_naming_it(
    gateway: RunningGateway,
) -> None:
    gateway.worker.embedding_size = 8
    gateway.worker.register()
    body = {"model": MODEL, "input": ["a", "b"], "dimensions": 9}
    with gateway.client() as http:
        reply = http.post("/v1/embeddings", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["type"]) == ("dimensions", "invalid_request_error")
    assert error["message"] == (
        f"dimensions: 9 is more than the 8 of model '{MODEL}''s embeddings; ask for 8 or fewer"
    )
    assert gateway.redis.zcard(Keys().queue(model_tag(MODEL))) == 0  # nothing was queued


def test_every_queued_body_declares_tokenqs_queue_fields_once() -> None:
    shared = QueueFields.model_json_schema()["properties"]
    for body in (ChatCompletionRequest, CompletionRequest, EmbeddingRequest):
        assert issubclass(body, QueueFields)
        properties = body.model_json_schema()["properties"]
        assert {name: properties[name] for name in shared} == shared
