"""A worker serving a hybrid model (Qwen3.5-shaped: Gated DeltaNet layers beside
attention, 4.5 MiB of state per sequence) under a small KV cache budget takes many
concurrent requests: the state slots and the KV blocks both come out of the budget, so
it runs a few at a time, every request finishes, a sample of them exactly as
``generate`` gives them alone, and the process's peak memory grows by no more than the
budget and the KV memory test's margin over its warmed-up size (measured as it does)
where a state per request held would take twice that."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client, Handle
from shared.models import FinishReason
from shared.settings import Settings
from tests.conftest import serve
from tests.integration.conftest import WorkerFactory
from tests.integration.faults import wait_until
from tests.integration.test_kv_memory_bound import finished, proc_status_kib
from tests.reference import greedy_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "tiny-hybrid"
KV_CACHE_MIB = 40  # 4 sequences' state, and 22 MiB (45,000 tokens) of KV cache
MARGIN_MIB = 128  # as the KV memory test's: a step's activations, allocator slack
MAX_TOKENS = 8
NUM_REQUESTS = 48  # 216 MiB of state if every request in the worker kept its own


def build_hybrid(path: Path, tokenizer_dir: Path) -> Path:
    """A random-weight Qwen3.5-shaped model (seeded) with the default model's tokenizer:
    two Gated DeltaNet layers and one attention layer. Their convolutions' window of 256
    tokens (2 MiB of state each, where real models keep 3) makes the state large at
    little compute."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = AutoConfig.for_model(
        "qwen3_5_text",
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=8,
        linear_num_value_heads=16,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=256,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(0)
    model: Any = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def prompt(i: int) -> str:
    lines = [f"Box {j} of row {i} holds {j * 7 % 31} marbles." for j in range(2 + i % 4)]
    return "\n".join(lines) + "\nHow many marbles are there?"


def test_a_hybrid_worker_with_many_concurrent_requests_stays_within_its_budget(
    real_redis: redis.Redis,
    start_worker: WorkerFactory,
    default_model_dir: Path,
    tmp_path: Path,
) -> None:
    model_dir = build_hybrid(tmp_path / MODEL, default_model_dir)
    serve(real_redis, MODEL)
    client = Client(connection=real_redis, settings=Settings())
    worker = start_worker(
        "--model", str(model_dir), "--served-model-name", MODEL,
        "--kv-cache-mib", str(KV_CACHE_MIB),
    )  # fmt: skip

    def submit(text: str, ignore_eos: bool = True) -> Handle:
        return client.submit(
            prompt=text, model=MODEL, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=ignore_eos
        )

    warm = [submit(prompt(i)) for i in range(8)]  # more than the slots
    wait_until(lambda: finished(warm), 300, "the warm-up requests")
    time.sleep(1)
    warm_kib = proc_status_kib(worker.pid, "VmRSS")
    Path(f"/proc/{worker.pid}/clear_refs").write_text("5")  # peak RSS starts again from now

    checked = [prompt(100 + i) for i in range(3)]
    handles = [submit(text, ignore_eos=False) for text in checked]  # as generate runs them
    handles += [submit(prompt(i)) for i in range(NUM_REQUESTS - len(checked))]
    wait_until(lambda: finished(handles), 600, "every request")
    peak_kib = proc_status_kib(worker.pid, "VmHWM")
    growth_mib = (peak_kib - warm_kib) / 1024
    print(
        f"warmed-up RSS {warm_kib / 1024:.0f} MiB, peak {peak_kib / 1024:.0f} MiB: "
        f"grew {growth_mib:.0f} MiB (budget {KV_CACHE_MIB} + margin {MARGIN_MIB})"
    )
    assert growth_mib <= KV_CACHE_MIB + MARGIN_MIB

    for handle in handles[len(checked) :]:
        result = handle.result(timeout=5)
        assert result.finish_reason is FinishReason.LENGTH and len(result.token_ids) == MAX_TOKENS
    references = greedy_reference(model_dir, [(text, False) for text in checked], MAX_TOKENS)
    for handle, reference in zip(handles[: len(checked)], references, strict=True):
        assert list(handle.result(timeout=5).token_ids) == reference
