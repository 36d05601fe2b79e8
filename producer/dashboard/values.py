"""Small conversions of what redis-py hands back (bytes or text) to plain values."""

from __future__ import annotations

from typing import Any

from shared.replies import text


def int_or_none(value: Any) -> int | None:
    if value is None or value == b"" or value == "":
        return None
    return int(float(text(value)))


def float_or_none(value: Any) -> float | None:
    if value is None or value == b"" or value == "":
        return None
    return float(text(value))


def decoded(raw: dict[Any, Any]) -> dict[str, str]:
    return {text(k): text(v) for k, v in raw.items()}


def redis_ms(reply: Any) -> int:
    """Redis TIME as unix ms (the clock every script stamps requests with)."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000
