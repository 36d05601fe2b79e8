"""What an idempotency key binds: the digest of the body submitted with it.

A key names one request. Sent again with the same body it answers that request; sent
with another body it is refused (``IdempotencyKeyReused``, HTTP 409), so a client that
reuses keys by mistake never gets another request's answer. admit.lua keeps the digest
beside the key and compares it, atomically with the key's lookup.

The digest is of the request as validated (defaults filled in, so a body that leaves a
default out matches one that states it), less what is not the submitter's to choose or
changes from one send of the same request to the next:

- ``idempotency_key``: the key itself (it names the request, it is not part of it);
- ``deadline_ms``: clients and gateways stamp it from a relative deadline at each send;
- ``version``: the wire schema's, which a client upgrade between retries may change;
- what the submit path sets from the caller's API key (``tenant``, ``tenant_weight``;
  metadata items of those names, where schema version 1 carried them): the tenant
  already scopes the key (``shared.keys``), and an operator may change a key's weight
  between a send and its retry;
- a W3C trace context (``traceparent``, ``tracestate``), as a field or a metadata item:
  every send is its own trace.
"""

from __future__ import annotations

import hashlib

import orjson

from shared.models import TENANT, TENANT_WEIGHT, GenerationRequest

UNBOUND_FIELDS = frozenset(
    {
        "idempotency_key",
        "deadline_ms",
        "version",
        "traceparent",
        "tracestate",
        TENANT,
        TENANT_WEIGHT,
    }
)
UNBOUND_METADATA = frozenset({TENANT, TENANT_WEIGHT, "traceparent", "tracestate"})


def body_digest(request: GenerationRequest) -> str:
    """The sha256 (hex) of the request's canonical JSON, less what is listed above."""
    body = request.model_dump(mode="json", exclude=set(UNBOUND_FIELDS))
    body["metadata"] = {
        k: v for k, v in body.get("metadata", {}).items() if k not in UNBOUND_METADATA
    }
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
