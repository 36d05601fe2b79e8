"""Webhook signatures: a receiver can tell a genuine delivery from a forged one."""

from __future__ import annotations

import pytest

from producer.batch.signing import BadSignature, sign, verify

BODY = b'{"id": "d1", "type": "batch.completed"}'
NOW = 1_700_000_000


def test_a_genuine_signature_verifies() -> None:
    signature = sign("secret", BODY, NOW)
    assert signature.startswith("sha256=") and len(signature) == 7 + 64
    verify("secret", BODY, str(NOW), signature, now_s=NOW + 10)


@pytest.mark.parametrize(
    ("secret", "body", "timestamp", "reason"),
    [
        ("other", BODY, NOW, "wrong secret or altered body"),
        ("secret", BODY + b" ", NOW, "wrong secret or altered body"),
        ("secret", BODY, NOW + 1, "wrong secret or altered body"),
    ],
)
def test_a_bad_signature_is_detected(secret: str, body: bytes, timestamp: int, reason: str) -> None:
    signature = sign(secret, BODY, NOW)
    with pytest.raises(BadSignature, match=reason):
        verify("secret", body, str(timestamp), signature, now_s=NOW)


def test_an_old_or_unsigned_delivery_is_refused() -> None:
    signature = sign("secret", BODY, NOW)
    with pytest.raises(BadSignature, match="tolerance"):
        verify("secret", BODY, str(NOW), signature, now_s=NOW + 301)
    with pytest.raises(BadSignature, match="missing"):
        verify("secret", BODY, None, signature)
    with pytest.raises(BadSignature, match="not unix seconds"):
        verify("secret", BODY, "yesterday", signature)
