"""The one submit path: the tenant is the submitter's, set in one place, whatever a
request or its metadata says."""

from __future__ import annotations

import pytest

from producer.client import Client
from producer.submit import Submitter, as_submitted
from shared.models import GenerationRequest
from tests.conftest import as_tenant


def stored(client: Client, request_id: str) -> GenerationRequest:
    payload = client.redis.hget(client.keys.request(request_id), "payload")
    assert payload is not None
    return GenerationRequest.model_validate_json(payload)


def test_the_submitter_sets_the_tenant_and_weight_whatever_the_request_said() -> None:
    claimed = GenerationRequest(
        model="m", prompt="p", tenant="mallory", tenant_weight=1000, metadata={"tenant": "eve"}
    )
    made = as_submitted(claimed, Submitter("acme", 2.0))
    assert (made.tenant, made.tenant_weight, made.metadata) == ("acme", 2.0, {"tenant": "eve"})
    assert as_submitted(claimed, Submitter()).tenant is None


def test_a_client_s_requests_are_its_submitter_s(client: Client) -> None:
    plain = client.submit("p", model="m", metadata={"tenant": "eve"})
    assert (stored(client, plain.id).tenant, plain.status().tenant) == (None, None)
    body = {"model": "m", "prompt": "p", "tenant": "mallory", "tenant_weight": 9}
    [named] = as_tenant(client, "acme", 2.0).submit_many([body])
    assert (stored(client, named.id).tenant, stored(client, named.id).tenant_weight) == (
        "acme",
        2.0,
    )
    assert named.status().tenant == "acme"


def test_a_client_takes_a_key_or_a_submitter_not_both(client: Client) -> None:
    with pytest.raises(ValueError, match="not both"):
        Client(connection=client.redis, api_key="sk-a", submitter=Submitter("acme"))
