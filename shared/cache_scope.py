"""Whose prefix cache a request may use: its cache salt, derived here and only here.

A prefix-cache hit is observable: a request whose prompt starts with cached blocks gets
its first token sooner. If two tenants shared the cache, one could learn from its own
time to first token whether another's prompt began with a given text (published as
prompt-leak attacks on shared KV caches). So the salt seeds both the worker's block
digests (``worker.engine.kv_cache``) and the prefix fingerprints claims compare
(``shared.prefixes``): blocks and warm sets are shared exactly where the salt is equal,
and warm sets always agree with what the blocks would give.

The salt covers:

- the request's tenant (``GenerationRequest.tenant``, set by a gateway from the API
  key): a tenant's own requests share its cache, two tenants never do. Requests
  without a tenant (a plain ``Client`` with no key, an open gateway's ``default``) and
  the tenants the operator lets share (``TOKENQ_CACHE_SHARED_TENANTS``, ``*`` for all)
  use one common cache, as before tenants were kept apart;
- the request's ``cache_salt`` (vLLM's field), for finer isolation within that: only
  requests with the same one share.

A request with neither gets the empty salt: its digests and fingerprints are the ones
tokenq made before salting.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

from shared.models import GenerationRequest
from shared.settings import Settings
from shared.usage import NO_TENANT

SALT_BYTES = 16
ALL_TENANTS = "*"


def cache_salt(req: GenerationRequest, settings: Settings) -> bytes:
    """``req``'s cache salt: empty, or ``SALT_BYTES`` bytes that no other scope shares."""
    scope = cache_tenant(req, settings) or ""
    if not scope and req.cache_salt is None:
        return b""
    h = hashlib.blake2b(digest_size=SALT_BYTES, person=b"tokenq-cache")
    for part in (scope, req.cache_salt or ""):
        raw = part.encode()
        h.update(len(raw).to_bytes(4, "little"))  # no two pairs of parts run together alike
        h.update(raw)
    return h.digest()


def cache_tenant(req: GenerationRequest, settings: Settings) -> str | None:
    """The tenant whose cache ``req`` uses; None for the common one."""
    tenant = req.tenant
    if tenant is None or tenant == NO_TENANT:  # an open gateway's callers
        return None
    shared = shared_tenants(settings.cache_shared_tenants)
    return None if ALL_TENANTS in shared or tenant in shared else tenant


@lru_cache(maxsize=8)
def shared_tenants(setting: str) -> frozenset[str]:
    """The tenant names of ``TOKENQ_CACHE_SHARED_TENANTS`` (a comma list, or ``*``)."""
    return frozenset(name.strip() for name in setting.split(",") if name.strip())
