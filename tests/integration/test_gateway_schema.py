"""Property tests from the served OpenAPI schema (schemathesis): whatever the input, the
gateway never answers 5xx, answers only what the schema declares, and every error body
is the OpenAI-style ``{"error": {message, type, param, code}}`` (Anthropic's
``{"type": "error", "error": {type, message}}`` on the Anthropic routes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import CheckContext
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from producer.anthropic.errors import AnthropicErrorResponse, is_anthropic_path
from producer.embedded import EmbeddedRedis
from producer.gateway.errors import ErrorResponse
from shared.settings import Settings
from tests.producer.gateway.process import gateway_process
from tests.producer.gateway.scripted import MODEL, ScriptedWorker

pytestmark = pytest.mark.integration
MAX_EXAMPLES = 150


@pytest.fixture(scope="module")
def api_schema(redis_server: EmbeddedRedis) -> Iterator[Any]:
    redis.Redis.from_url(redis_server.url).flushall()
    worker = ScriptedWorker(redis_server.url, Settings(redis_url=redis_server.url)).start()
    try:
        with gateway_process(redis_server.url) as url:
            yield schemathesis.openapi.from_url(f"{url}/openapi.json")
    finally:
        worker.stop()


@schemathesis.check
def error_body_is_well_formed(ctx: CheckContext, response: Any, case: Any) -> bool | None:
    """OpenAI's error shape; Anthropic's on the Anthropic routes."""
    if response.status_code < 400:
        return None
    if is_anthropic_path(case.path):
        AnthropicErrorResponse.model_validate_json(response.content)
    else:
        ErrorResponse.model_validate_json(response.content)
    return True


def _code(response: Any) -> str | None:
    if '"type":"error"' in response.text:  # Anthropic's shape has no code
        return None
    return ErrorResponse.model_validate_json(response.content).error.code


@schemathesis.check
def no_server_error(ctx: CheckContext, response: Any, case: Any) -> bool | None:
    """No 5xx, except the declared 504 for a request whose own (generated) deadline
    passed while it was queued: that one is the client's doing, not a server fault."""
    if response.status_code == 504 and _code(response) == "deadline_expired":
        return True
    if response.status_code >= 500:
        raise AssertionError(f"{response.status_code}: {response.text[:500]}")
    return True


CHECKS = [
    no_server_error,
    error_body_is_well_formed,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api_conforms_to_its_schema(api_schema: Any, mode: GenerationMode) -> None:

    @given(case=api_schema.as_strategy(generation_mode=mode), live=st.booleans())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any, live: bool) -> None:
        if live and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = MODEL  # half the bodies reach the scripted worker
        case.call_and_validate(checks=CHECKS, timeout=30)

    run()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ],
)
def test_streams_conform_to_the_schema(api_schema: Any, path: str, body: dict[str, Any]) -> None:
    case = api_schema[path]["POST"].Case(body={**body, "model": MODEL, "stream": True})
    response = case.call_and_validate(checks=CHECKS, timeout=30)
    assert response.text.endswith("data: [DONE]\n\n")


def test_a_response_stream_conforms_to_the_schema(api_schema: Any) -> None:
    case = api_schema["/v1/responses"]["POST"].Case(
        body={"model": MODEL, "input": "hi", "stream": True}
    )
    response = case.call_and_validate(checks=CHECKS, timeout=30)
    assert response.text.count("event: response.completed") == 1


def test_native_events_conform_to_the_schema(api_schema: Any) -> None:
    submit = api_schema["/v1/requests"]["POST"].Case(body={"model": MODEL, "prompt": "hi"})
    request_id = submit.call_and_validate(checks=CHECKS, timeout=30).json()["id"]
    events = api_schema["/v1/requests/{request_id}/events"]["GET"]
    response = events.Case(path_parameters={"request_id": request_id}).call_and_validate(
        checks=CHECKS, timeout=30
    )
    assert "event: final" in response.text


def test_generated_requests_did_reach_the_worker(
    redis_server: EmbeddedRedis, api_schema: Any
) -> None:
    r = redis.Redis.from_url(redis_server.url)
    num_requests = sum(1 for _ in r.scan_iter(match="tokenq:*:req:*", count=1000))
    r.close()
    print("requests reaching redis:", num_requests)
    assert num_requests > 0
