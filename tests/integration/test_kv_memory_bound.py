"""A worker given a small KV cache budget serves prompts of thousands of tokens beside
dozens of short requests within it: every request finishes, the long ones exactly as
``generate`` gives them alone, and the process's peak memory grows by no more than
the budget and a small margin over its warmed-up size. A prompt the pool can never
hold fails with a clear error, and nothing else is disturbed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from producer.client import Client, Handle
from shared.models import FinishReason, RequestState
from shared.settings import DEFAULT_MODEL, Settings
from tests.conftest import serve
from tests.integration.conftest import WorkerFactory
from tests.integration.faults import wait_until
from tests.reference import greedy_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1500)]

KV_CACHE_MIB = 160  # about 3,600 tokens of SmolLM2-135M's KV cache (45 KiB a token)
# What the process may add beyond the pool: a 512-token step's activations and
# attention scratch, the logits of a full batch, allocator slack.
MARGIN_MIB = 128
MAX_TOKENS = 16
NUM_SHORT = 40


def long_prompt(topic: str, num_items: int) -> str:
    lines = [
        f"Item {i}: a {topic} numbered {i * 7 % 113}, kept in box {i % 17}."
        for i in range(num_items)
    ]
    return "Inventory:\n" + "\n".join(lines) + "\nThe last item listed is"


def finished(handles: list[Handle]) -> bool:
    states = {h.status().state for h in handles}
    return states <= {RequestState.FINISHED, RequestState.FAILED}


def proc_status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def test_long_prompts_beside_many_short_ones_stay_within_the_kv_budget(
    real_redis: redis.Redis, start_worker: WorkerFactory, default_model_dir: Path
) -> None:
    serve(real_redis, DEFAULT_MODEL)
    client = Client(connection=real_redis, settings=Settings())
    worker = start_worker("--kv-cache-mib", str(KV_CACHE_MIB), "--max-num-seqs", "32")

    def submit(text: str, ignore_eos: bool = True) -> Handle:
        return client.submit(
            prompt=text, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=ignore_eos
        )

    warm = [submit(f"Warm-up question {i}: what is {i} plus {i}?") for i in range(4)]
    warm.append(submit(long_prompt("pebble", 24)))  # a full 512-token step too
    wait_until(lambda: finished(warm), 600, "the warm-up requests")
    time.sleep(1)
    warm_kib = proc_status_kib(worker.pid, "VmRSS")
    Path(f"/proc/{worker.pid}/clear_refs").write_text("5")  # peak RSS starts again from now

    long_texts = [long_prompt("marble", 150), long_prompt("button", 140)]  # ~3,000 tokens
    shorts = [submit(f"Question {i}: name a word that rhymes with {i}.") for i in range(NUM_SHORT)]
    longs = [submit(text, ignore_eos=False) for text in long_texts]  # as generate runs them
    too_long = submit(long_prompt("coin", 250))  # ~5,000 tokens: more than the pool holds
    shorts += [submit(f"Late question {i}: what comes after {i}?") for i in range(NUM_SHORT // 2)]
    everything = [*shorts, *longs, too_long]
    wait_until(lambda: finished(everything), 1200, "every request")
    peak_kib = proc_status_kib(worker.pid, "VmHWM")
    growth_mib = (peak_kib - warm_kib) / 1024
    print(
        f"warmed-up RSS {warm_kib / 1024:.0f} MiB, peak {peak_kib / 1024:.0f} MiB: "
        f"grew {growth_mib:.0f} MiB (budget {KV_CACHE_MIB} + margin {MARGIN_MIB})"
    )
    assert growth_mib <= KV_CACHE_MIB + MARGIN_MIB

    refused = too_long.result(timeout=5)
    assert refused.finish_reason is FinishReason.ERROR and not refused.token_ids
    assert refused.error is not None and "KV cache" in refused.error
    assert "--kv-cache-mib" in refused.error
    for handle in shorts:
        result = handle.result(timeout=5)
        assert result.finish_reason is FinishReason.LENGTH and len(result.token_ids) == MAX_TOKENS
    references = greedy_reference(default_model_dir, [(t, False) for t in long_texts], MAX_TOKENS)
    for handle, reference in zip(longs, references, strict=True):
        result = handle.result(timeout=5)
        assert result.usage.prompt_tokens > 2500
        assert list(result.token_ids) == reference
