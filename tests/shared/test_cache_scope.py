"""Whose prefix cache a request uses (shared/cache_scope.py): its tenant's, unless the
operator lets it share; its cache_salt's within that; the common one without either,
where digests and fingerprints are what they were before salts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from shared.cache_scope import cache_salt
from shared.models import MAX_CACHE_SALT_CHARS, GenerationRequest
from shared.prefixes import fingerprints
from shared.settings import Settings

SYSTEM = "You are the assistant of a bank. " * 40


def chat(tenant: str | None = None, **kwargs: Any) -> GenerationRequest:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    return GenerationRequest(model="m", messages=messages, tenant=tenant, **kwargs)


def salt(tenant: str | None = None, shared: str = "", **kwargs: Any) -> bytes:
    return cache_salt(chat(tenant, **kwargs), Settings(cache_shared_tenants=shared))


def test_each_tenant_has_its_own_salt_and_requests_without_one_none() -> None:
    assert salt() == b"" == salt("default")  # an open gateway's callers: the common cache
    assert salt("acme") == salt("acme") != salt("globex")
    assert b"" not in (salt("acme"), salt("globex"))
    # The system prompt's fingerprint follows: equal within a tenant, never across.
    first = [fingerprints(chat(t), salt(t))[0] for t in ("acme", "acme", "globex", None)]
    assert first[0] == first[1] and len(set(first)) == 3
    assert first[3] == fingerprints(chat(), b"")[0]


def test_tenants_the_operator_names_share_the_common_cache() -> None:
    assert salt("acme", shared="acme, globex") == salt("globex", shared="acme,globex") == b""
    assert salt("initech", shared="acme,globex") == salt("initech")
    assert salt("initech", shared="*") == b""


def test_a_cache_salt_narrows_the_tenants_cache() -> None:
    assert salt("acme", cache_salt="u1") == salt("acme", cache_salt="u1")
    narrowed = {salt("acme", cache_salt="u1"), salt("acme", cache_salt="u2"), salt("acme")}
    assert len(narrowed) == 3
    assert salt(cache_salt="u1") not in (b"", salt("acme", cache_salt="u1"))
    assert salt("acme", shared="*", cache_salt="u1") == salt(cache_salt="u1")
    # The parts cannot run together: tenant "ab" + salt "c" is not tenant "a" + salt "bc".
    assert salt("ab", cache_salt="c") != salt("a", cache_salt="bc")


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENQ_CACHE_SHARED_TENANTS", "acme,globex")
    assert cache_salt(chat("globex"), Settings()) == b""
    assert cache_salt(chat("initech"), Settings()) != b""


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "at least 1 character"),
        ("x" * (MAX_CACHE_SALT_CHARS + 1), f"at most {MAX_CACHE_SALT_CHARS} characters"),
        ("user\n1", "printable"),
        ("user\x001", "printable"),
    ],
)
def test_a_bad_cache_salt_is_refused_naming_the_field(value: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as e:
        chat(cache_salt=value)
    assert e.value.errors()[0]["loc"] == ("cache_salt",)
