"""The pooler: chunks of one prompt combined per method, normalised at the end."""

from __future__ import annotations

import math

import pytest

from worker.engine.pooling import Pooler


@pytest.mark.parametrize(
    ("method", "expected"), [("mean", [0.6, 0.8]), ("last", [1.0, 0.0]), ("cls", [0.0, 1.0])]
)
def test_chunks_combine_per_method(method: str, expected: list[float]) -> None:
    pooler = Pooler(method)
    pooler.add("r", [0.0, 3.0])  # a mean chunk is a sum; last and cls a single row
    pooler.add("r", [1.0, 1.0])
    pooler.add("r", [2.0, 0.0])
    assert pooler.finish("r") == pytest.approx(expected)


def test_dimensions_truncate_then_normalise() -> None:
    pooler = Pooler("mean")
    pooler.add("r", [3.0, 4.0, 100.0])
    assert pooler.finish("r", dimensions=2) == pytest.approx([0.6, 0.8])


def test_a_discarded_request_starts_again() -> None:
    pooler = Pooler("mean")
    pooler.add("r", [100.0, 0.0])
    pooler.discard("r")  # preempted: its chunks are computed again
    pooler.add("r", [0.0, 2.0])
    vector = pooler.finish("r")
    assert vector == pytest.approx([0.0, 1.0])
    assert math.isclose(math.fsum(v * v for v in vector), 1.0)


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pooling 'max': use one of mean, last, cls"):
        Pooler("max")
