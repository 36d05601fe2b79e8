"""What redis-py hands back (bytes, or str on a decoding client) as plain values."""

from __future__ import annotations

from typing import Any


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
