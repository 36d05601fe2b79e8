"""Property tests from the served OpenAPI schema (schemathesis): whatever the input, the
gateway never answers 5xx, answers only what the schema declares, and every error body
is the OpenAI-style ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import CheckContext
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from producer.embedded import EmbeddedRedis
from producer.gateway.errors import ErrorResponse
from shared.settings import Settings
from tests.producer.gateway.process import gateway_process
from tests.producer.gateway.scripted import ScriptedWorker

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
    if response.status_code < 400:
        return None
    ErrorResponse.model_validate_json(response.content)
    return True


@schemathesis.check
def no_server_error(ctx: CheckContext, response: Any, case: Any) -> bool | None:
    if response.status_code >= 500:
        raise AssertionError(f"{response.status_code}: {response.text[:500]}")
    return True


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api_conforms_to_its_schema(api_schema: Any, mode: GenerationMode) -> None:
    checks = [no_server_error, error_body_is_well_formed, status_code_conformance,
              content_type_conformance, response_schema_conformance]  # fmt: skip

    @given(case=api_schema.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def run(case: Any) -> None:
        case.call_and_validate(checks=checks, timeout=30)

    run()
