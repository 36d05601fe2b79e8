"""The request's wire schema: the tenant a field of it, and what earlier versions wrote."""

from __future__ import annotations

import orjson

from shared.models import SCHEMA_VERSION, GenerationRequest


def test_the_tenant_is_a_field_and_a_version_1_payload_still_carries_its_own() -> None:
    version_1 = {
        "version": 1,
        "model": "m",
        "prompt": "p",
        "metadata": {"tenant": "acme", "tenant_weight": 2, "note": "kept"},
    }
    old = GenerationRequest.model_validate_json(orjson.dumps(version_1))
    assert (old.tenant, old.tenant_weight, old.metadata) == ("acme", 2.0, {"note": "kept"})
    assert old.version == SCHEMA_VERSION == 2
    unweighted = {**version_1, "metadata": {"tenant": "acme"}}
    assert GenerationRequest.model_validate(unweighted).tenant_weight == 1.0
    # In this version metadata is the submitter's own: it names no tenant.
    new = GenerationRequest(model="m", prompt="p", metadata={"tenant": "acme"})
    assert (new.tenant, new.metadata) == (None, {"tenant": "acme"})
    again = GenerationRequest.model_validate_json(old.model_dump_json())
    assert (again.tenant, again.tenant_weight) == ("acme", 2.0)
