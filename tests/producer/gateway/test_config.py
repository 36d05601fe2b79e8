from __future__ import annotations

import pytest

from producer.gateway.config import ApiKey, load_api_keys, parse_api_keys
from shared.errors import InvalidRequest
from shared.settings import Settings


def test_compact_and_json_specs_agree() -> None:
    compact = parse_api_keys("sk-a=acme:high, sk-b=beta")
    as_json = parse_api_keys(
        '{"sk-a": {"tenant": "acme", "max_priority": "high"}, "sk-b": {"tenant": "beta"}}'
    )
    assert compact == as_json
    assert compact.lookup("sk-a") == ApiKey("acme", 75)
    assert compact.lookup("sk-b") == ApiKey("beta", 50)
    assert compact.lookup("sk-c") is None


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
    ],
)
def test_a_bad_spec_says_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        parse_api_keys(spec)
