"""EngineConfig: checked when made, naming the field that is wrong; fixed after."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from worker.engine import EngineConfig


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0),
        ("kv_cache_mib", 0),
        ("kv_block_size", 0),
        ("prefill_chunk_tokens", 0),
        ("num_lookahead_slots", -1),
        ("num_threads", 0),
        ("ttft_priority", -1),
        ("max_model_len", 1),
        ("kv_cache_share", 0.0),
        ("kv_cache_share", 1.5),
        ("aging_interval_s", 0.0),
        ("max_num_seqs", 2.5),
        ("kv_block_size", True),
        ("pooling", "max"),
        ("quantization", "int4"),
    ],
)
def test_an_invalid_field_is_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"^{field} must be"):
        EngineConfig(model="m", **{field: value})


def test_an_empty_model_is_refused() -> None:
    with pytest.raises(ValueError, match="model"):
        EngineConfig(model="")


def test_optional_limits_take_none_and_the_defaults_are_valid() -> None:
    config = EngineConfig(
        model="m", kv_cache_mib=None, prefill_chunk_tokens=None, ttft_priority=None
    )
    assert config.enable_prefix_caching
    cpu = config.for_device("cpu")
    assert (cpu.max_num_seqs, cpu.max_num_batched_tokens, cpu.kv_cache_share) == (64, 512, 0.3)


def test_a_gpu_gets_gpu_defaults_and_what_the_operator_set_stays() -> None:
    cuda = EngineConfig(model="m", max_num_seqs=32).for_device("cuda")
    assert (cuda.max_num_seqs, cuda.max_num_batched_tokens, cuda.kv_cache_share) == (32, 2048, 0.8)
    assert EngineConfig(model="m").for_device("cuda").max_num_seqs == 256


def test_asynchronous_scheduling_is_on_where_a_device_computes_unless_set_off() -> None:
    """Asynchronous scheduling hides the host's work behind a device's step; on the CPU's
    own forward, which computes on the host's cores, it is slower (docs/benchmarks.md)."""
    assert EngineConfig(model="m").for_device("cuda").async_scheduling is True
    assert EngineConfig(model="m", timed_forward_ms=2.0).for_device("cpu").async_scheduling is True
    assert EngineConfig(model="m").for_device("cpu").async_scheduling is False
    assert EngineConfig(model="m", async_scheduling=True).for_device("cpu").async_scheduling
    chosen = EngineConfig(model="m", async_scheduling=False).for_device("cuda")
    assert chosen.async_scheduling is False


def test_a_config_is_frozen() -> None:
    config = EngineConfig(model="m", kv_cache_mib=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.kv_cache_mib = 1  # type: ignore[misc]
    assert dataclasses.replace(config, kv_cache_mib=128).kv_cache_mib == 128
