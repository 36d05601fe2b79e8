"""Prefix affinity between tenants (enqueue.lua's fingerprints, claim.lua, warm.lua):
the same prefix from two tenants is two prefixes, so one tenant's warm set never draws
another's requests and their requests are not grouped as siblings, unless the operator
lets them share a cache; on fakeredis, a real redis-server and a real Redis Cluster."""

from __future__ import annotations

from typing import Any

from producer.client import Client, Handle
from shared.replies import text
from shared.settings import Settings
from tests.conftest import as_tenant as tenant_client
from tests.shared.test_claim_affinity import KEYS, ask, claim, ids, system_fingerprint, warm
from tests.shared.test_scripts import TAG


def as_tenant(client: Client, tenant: str, system: str, question: str, **kw: Any) -> Handle:
    return ask(tenant_client(client, tenant), system, question, **kw)


def queued(client: Client) -> list[str]:
    return [text(i) for i in client.redis.zrange(KEYS.queue(TAG), 0, -1)]


def sharing(client: Client, tenants: str) -> Client:
    """``client``'s connection under TOKENQ_CACHE_SHARED_TENANTS=``tenants``."""
    return Client(
        connection=client.redis, settings=Settings(max_queued=50, cache_shared_tenants=tenants)
    )


def test_another_tenants_warm_prefix_is_no_warm_match(client: Client) -> None:
    # acme's earlier request puts its next one behind globex's in the fair order.
    earlier = as_tenant(client, "acme", "law", "earlier, another system prompt")
    older = as_tenant(client, "globex", "tax", "same system prompt, older")
    newer = as_tenant(client, "acme", "tax", "same system prompt, newer")
    assert queued(client)[-1] == newer.id
    assert system_fingerprint(client, older) != system_fingerprint(client, newer)
    warm(client, "w", [system_fingerprint(client, newer)])  # the worker served acme's
    [taken] = claim(client)
    assert (taken.request_id, taken.by_affinity) == (newer.id, True)
    assert set(ids(claim(client, 2))) == {earlier.id, older.id}


def test_two_tenants_requests_are_not_grouped_as_siblings(client: Client) -> None:
    """With nothing warm, a claim takes its head's siblings with it: its own tenant's
    (whichever tenant's request heads the fair order), never the other tenant's."""
    a1 = as_tenant(client, "acme", "law", "first")
    g1 = as_tenant(client, "globex", "law", "second")
    g2 = as_tenant(client, "globex", "law", "third")
    a2 = as_tenant(client, "acme", "law", "fourth")
    pairs = [{a1.id, a2.id}, {g1.id, g2.id}]
    first, second = set(ids(claim(client, 2))), set(ids(claim(client, 2)))
    assert first in pairs and second in pairs and first != second


def test_tenants_let_share_are_warm_matches_and_siblings(client: Client) -> None:
    shared = sharing(client, "acme,globex")
    earlier = as_tenant(shared, "acme", "law", "earlier, another system prompt")
    older = as_tenant(shared, "globex", "tax", "older")
    newer = as_tenant(shared, "acme", "tax", "newer")
    other = as_tenant(shared, "initech", "tax", "not named: its own cache")
    assert system_fingerprint(shared, older) == system_fingerprint(shared, newer)
    assert system_fingerprint(shared, other) != system_fingerprint(shared, newer)
    warm(shared, "w", [system_fingerprint(shared, newer)])
    # Both warm, and siblings: one claim takes them together, ahead of the others.
    taken = claim(shared, 2)
    assert {c.request_id for c in taken} == {older.id, newer.id}
    assert set(ids(claim(shared, 2))) == {earlier.id, other.id}


def test_with_every_tenant_sharing_a_tenants_prefix_is_everyones(client: Client) -> None:
    shared = sharing(client, "*")
    acme = as_tenant(shared, "acme", "law", "first")
    cook = as_tenant(shared, "initech", "cook", "second")
    globex = as_tenant(shared, "globex", "law", "third")
    plain = ask(shared, "law", "no tenant")
    law = system_fingerprint(shared, acme)
    assert system_fingerprint(shared, globex) == law == system_fingerprint(shared, plain)
    warm(shared, "w", [law])
    assert set(ids(claim(shared, 3))) == {acme.id, globex.id, plain.id}
    assert ids(claim(shared)) == [cook.id]
