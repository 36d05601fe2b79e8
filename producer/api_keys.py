"""API keys: who submits, for the gateway and for a ``producer.Client(api_key=...)``.

``TOKENQ_API_KEYS`` holds the keys, either as JSON::

    {"sk-abc": {"tenant": "acme", "max_priority": "high", "weight": 3,
                "requests_per_min": 600, "tokens_per_min": 200000, "max_concurrent": 20},
     "sk-def": {"tenant": "ops"}}

or compactly as ``key=tenant[:max_priority]`` items separated by commas::

    sk-abc=acme:high,sk-def=ops

``max_priority`` is a level name or 0..100 and defaults to ``normal``. ``weight``
(default 1) is the key's share against other tenants within a priority
(``shared.fairness``); ``requests_per_min``, ``tokens_per_min`` and
``max_concurrent`` (default none) are its rate limits (``shared.ratelimit``), shared
by every gateway and by a ``producer.Client(api_key=...)``. No keys (unset or empty)
leaves the gateway open.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from shared.errors import InvalidRequest
from shared.models import check_weight
from shared.priority import Priority, parse_priority
from shared.ratelimit import Limits, bucket_of
from shared.settings import Settings

API_KEYS_ENV = "TOKENQ_API_KEYS"
LIMIT_FIELDS = ("requests_per_min", "tokens_per_min", "max_concurrent")
KEY_FIELDS = {"tenant", "max_priority", "weight", *LIMIT_FIELDS}


@dataclass(frozen=True)
class ApiKey:
    tenant: str
    max_priority: int = int(Priority.NORMAL)
    weight: float = 1.0
    limits: Limits = field(default_factory=Limits)
    bucket: str = ""  # its rate limits' name in Redis (bucket_of the key's digest)


@dataclass(frozen=True)
class ApiKeys:
    """Keys by the SHA-256 of their text, so a lookup's timing tells nothing of a key."""

    by_digest: dict[str, ApiKey] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return not self.by_digest

    def lookup(self, token: str) -> ApiKey | None:
        return self.by_digest.get(digest(token))

    @classmethod
    def of(cls, keys: dict[str, ApiKey]) -> ApiKeys:
        return cls({digest(k): replace(v, bucket=bucket_of(digest(k))) for k, v in keys.items()})


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def find_key(settings: Settings, api_key: str) -> ApiKey:
    """The key ``api_key`` of ``TOKENQ_API_KEYS``, as a client submitting with it is."""
    key = load_api_keys(settings).lookup(api_key)
    if key is None:
        raise InvalidRequest(
            "unknown API key: give one listed in TOKENQ_API_KEYS (the gateway's keys)"
        )
    return key


def load_api_keys(settings: Settings | None = None) -> ApiKeys:
    """The keys in ``TOKENQ_API_KEYS`` (see the module docstring)."""
    text = (settings or Settings()).api_keys.get_secret_value().strip()
    return parse_api_keys(text)


def parse_api_keys(text: str) -> ApiKeys:
    if not text:
        return ApiKeys()
    items = _from_json(text) if text.startswith("{") else _from_compact(text)
    return ApiKeys.of({key: _api_key(key, spec) for key, spec in items.items()})


def _from_json(text: str) -> dict[str, Any]:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"{API_KEYS_ENV} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise InvalidRequest(f"{API_KEYS_ENV} must be a JSON object of key -> spec")
    return data


def _from_compact(text: str) -> dict[str, Any]:
    items: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, rest = item.partition("=")
        if not sep or not key.strip() or not rest.strip():
            raise InvalidRequest(
                f"{API_KEYS_ENV}: expected key=tenant[:max_priority], got {item!r}"
            )
        tenant, _, prio = rest.partition(":")
        items[key.strip()] = {"tenant": tenant.strip(), "max_priority": prio.strip() or "normal"}
    return items


def _api_key(key: str, spec: Any) -> ApiKey:
    where = f"{API_KEYS_ENV}: key ending {key[-4:]!r}"
    if not isinstance(spec, dict) or not isinstance(spec.get("tenant"), str) or not spec["tenant"]:
        raise InvalidRequest(f"{where} needs a non-empty tenant")
    unknown = sorted(set(spec) - KEY_FIELDS)
    if unknown:
        raise InvalidRequest(f"{where}: unknown field(s) {unknown}; known: {sorted(KEY_FIELDS)}")
    try:
        return ApiKey(
            spec["tenant"],
            parse_priority(spec.get("max_priority", "normal")),
            check_weight(spec.get("weight", 1.0)),
            Limits(*(_limit(spec.get(name), name) for name in LIMIT_FIELDS)),
        )
    except ValueError as e:
        raise InvalidRequest(f"{where}: {e}") from e


def _limit(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")
    return value
