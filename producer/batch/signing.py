"""HMAC-SHA256 webhook signatures.

The signed message is ``<timestamp>.<body>`` (unix seconds, a dot, the raw body),
sent as ``X-Tokenq-Signature: sha256=<hex>`` with ``X-Tokenq-Timestamp``; binding
the timestamp lets a receiver refuse replays of an old delivery.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from shared.errors import TokenqError

SIGNATURE_HEADER = "X-Tokenq-Signature"
TIMESTAMP_HEADER = "X-Tokenq-Timestamp"
DELIVERY_HEADER = "X-Tokenq-Delivery"
EVENT_HEADER = "X-Tokenq-Event"
DEFAULT_TOLERANCE_S = 300


class BadSignature(TokenqError):
    """A webhook's signature does not match its body, or its timestamp is too old."""


def sign(secret: str | bytes, body: bytes, timestamp: int) -> str:
    """The ``X-Tokenq-Signature`` value for ``body`` sent at ``timestamp``."""
    key = secret.encode() if isinstance(secret, str) else secret
    digest = hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify(
    secret: str | bytes,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now_s: float | None = None,
) -> None:
    """Raise BadSignature unless ``signature`` signs ``body`` at a recent ``timestamp``."""
    if not timestamp or not signature:
        raise BadSignature(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
    try:
        sent_s = int(timestamp)
    except ValueError as e:
        raise BadSignature(f"{TIMESTAMP_HEADER} is not unix seconds: {timestamp!r}") from e
    age_s = (time.time() if now_s is None else now_s) - sent_s
    if abs(age_s) > tolerance_s:
        raise BadSignature(f"timestamp is {age_s:.0f}s away from now (tolerance {tolerance_s}s)")
    if not hmac.compare_digest(sign(secret, body, sent_s), signature):
        raise BadSignature("signature does not match the body: wrong secret or altered body")
