from __future__ import annotations

import logging

import pytest

from producer.api_keys import parse_api_keys
from producer.gateway.app import _log_access, create_app
from producer.gateway.config import GatewayConfig
from tests.producer.gateway.conftest import RunningGateway


def test_an_open_gateway_says_so_at_start(
    caplog: pytest.LogCaptureFixture, gateway: RunningGateway
) -> None:
    setup = " ".join(r.getMessage() for r in caplog.get_records("setup"))
    assert "no API keys configured (TOKENQ_API_KEYS): the gateway is open" in setup


def test_a_keyed_gateway_names_its_tenants(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="producer.gateway"):
        _log_access(GatewayConfig(api_keys=parse_api_keys("a=ops:high,b=web,c=web")))
    assert caplog.messages == ["3 API keys for tenants ops, web"]


def test_the_schema_documents_400_errors_not_fastapis_422() -> None:
    schema = create_app(config=GatewayConfig(api_keys=parse_api_keys(""))).openapi()
    chat = schema["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "422" not in chat and "HTTPValidationError" not in schema["components"]["schemas"]
    assert chat["400"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorResponse")
    assert set(chat["200"]["content"]) == {"application/json", "text/event-stream"}
