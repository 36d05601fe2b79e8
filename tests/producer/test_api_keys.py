from __future__ import annotations

import pytest

from producer.api_keys import ApiKey, load_api_keys, parse_api_keys
from shared.errors import InvalidRequest
from shared.ratelimit import Limits
from shared.settings import Settings


def test_compact_and_json_specs_agree() -> None:
    compact = parse_api_keys("sk-a=acme:high, sk-b=beta")
    as_json = parse_api_keys(
        '{"sk-a": {"tenant": "acme", "max_priority": "high"}, "sk-b": {"tenant": "beta"}}'
    )
    assert compact == as_json
    a, b = compact.lookup("sk-a"), compact.lookup("sk-b")
    assert a is not None and b is not None
    assert (a.tenant, a.max_priority, a.weight, a.limits) == ("acme", 75, 1.0, Limits())
    assert (b.tenant, b.max_priority) == ("beta", 50)
    assert a.bucket and a.bucket != b.bucket  # each key its own rate-limit bucket
    assert compact.lookup("sk-c") is None


def test_weight_and_limits_are_configured_beside_the_key() -> None:
    keys = parse_api_keys(
        '{"sk-a": {"tenant": "acme", "weight": 3, "requests_per_min": 600,'
        ' "tokens_per_min": 90000, "max_concurrent": 8}}'
    )
    key = keys.lookup("sk-a")
    assert key is not None and key.weight == 3.0
    assert key.limits == Limits(600, 90000, 8) and key.limits.any
    assert not ApiKey("t").limits.any


def test_no_keys_means_open() -> None:
    assert load_api_keys(Settings()).open
    assert load_api_keys(Settings(api_keys="  ")).open
    assert not load_api_keys(Settings(api_keys="k=t")).open


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("sk-a", "expected key=tenant"),
        ("sk-a=acme:urgent", "unknown priority 'urgent'"),
        ('{"sk-a": {}}', "needs a non-empty tenant"),
        ("{oops", "not valid JSON"),
        ('{"sk-a": {"tenant": "t", "max_priority": 500}}', "out of range"),
        ('{"sk-a": {"tenant": "t", "weight": 0}}', "tenant_weight 0 is out of range"),
        ('{"sk-a": {"tenant": "t", "requests_per_min": 0}}', "requests_per_min must be"),
        ('{"sk-a": {"tenant": "t", "rpm": 5}}', r"unknown field\(s\) \['rpm'\]"),
    ],
)
def test_a_bad_spec_says_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        parse_api_keys(spec)
