"""The CUDA step: flattened inputs and buckets (on any machine), and the paged
kernel and captured graphs themselves (marked ``cuda``: they run where a GPU is,
``pytest -m cuda``, and are deselected elsewhere)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from tests.worker.engine.conftest import EngineFactory
from tests.worker.engine.factories import load_workload, make_request
from worker.engine.cuda_graphs import PagedInputs, graph_sizes
from worker.engine.outputs import ScheduledSeq
from worker.engine.request import LoraRef, Sequence


def _scheduled(
    prompt: list[int], start_pos: int, num_tokens: int, table: list[int]
) -> ScheduledSeq:
    seq = Sequence.from_request(make_request(prompt), 0)
    seq.block_table = table
    return ScheduledSeq(seq, start_pos, num_tokens, sample=start_pos + num_tokens == len(prompt))


def test_buckets_cover_every_step_size_up_to_the_budget() -> None:
    sizes = graph_sizes(2048)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 2048
    assert sizes == sorted(set(sizes))
    assert all(b - a <= 128 for a, b in itertools.pairwise(sizes))
    assert graph_sizes(100)[-1] == 100 and graph_sizes(1) == [1]


def test_a_step_flattens_decode_rows_and_prefill_chunks_alike() -> None:
    decode = _scheduled(list(range(1, 21)), 19, 1, [7, 3])  # token 20 at position 19
    chunk = _scheduled(list(range(1, 41)), 16, 8, [5, 9, 2])  # positions 16..23, no sample
    inputs = PagedInputs.build([decode, chunk], block_size=16)
    assert inputs.token_ids == [20, *range(17, 25)]
    assert inputs.positions == [19, *range(16, 24)]
    assert inputs.slot_mapping == [3 * 16 + 3, *(9 * 16 + p for p in range(8))]
    assert inputs.token_row == [0] + [1] * 8
    assert inputs.sample_index == [0]
    assert inputs.padded_tables().tolist() == [[7, 3, 0], [5, 9, 2]]


cuda = pytest.mark.cuda


def _reference(
    q: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor],
    tables: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    k_cache, v_cache = caches
    group = q.shape[1] // k_cache.shape[1]
    out = torch.zeros_like(q, dtype=torch.float32)
    for t, (row, pos) in enumerate(zip(rows.tolist(), positions.tolist(), strict=True)):
        if pos < 0:
            continue
        context = torch.arange(pos + 1, device=q.device)
        slots = tables[row][context // block_size].long() * block_size + context % block_size
        keys = k_cache[slots].float().repeat_interleave(group, dim=1)
        values = v_cache[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,chd->hc", q[t].float(), keys) / math.sqrt(q.shape[-1])
        out[t] = torch.einsum("hc,chd->hd", torch.softmax(scores, dim=-1), values)
    return out


@cuda
def test_the_paged_kernel_equals_attention_over_gathered_context() -> None:
    from worker.engine.paged_attention import paged_attention

    torch.manual_seed(0)
    device, block_size = torch.device("cuda"), 16
    caches = (
        torch.randn(64 * block_size, 3, 64, device=device, dtype=torch.bfloat16),
        torch.randn(64 * block_size, 3, 64, device=device, dtype=torch.bfloat16),
    )
    tables = torch.randperm(64, device=device)[:60].view(3, 20).int()
    rows = torch.tensor([0, 0, 0, 1, 2, 2, 1], dtype=torch.int32, device=device)
    positions = torch.tensor([0, 5, 70, 300, 17, -1, 318], dtype=torch.int32, device=device)
    q = torch.randn(7, 9, 64, device=device, dtype=torch.bfloat16)
    out = paged_attention(q, *caches, tables, rows, positions, 64**-0.5, block_size)
    expected = _reference(q, caches, tables, rows, positions, block_size)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    assert out[5].abs().max().item() == 0  # a padding token reads nothing


@cuda
def test_captured_graphs_give_the_eager_engines_tokens(make_engine: EngineFactory) -> None:
    """fp32, so that the only difference between the two is graph replay and padding."""
    graphed = make_engine(device="cuda", dtype="float32", kv_cache_mib=512)
    eager = make_engine(device="cuda", dtype="float32", kv_cache_mib=512, enforce_eager=True)
    assert graphed.runner.graphs is not None and eager.runner.graphs is None
    rows = load_workload("mixed32.jsonl")
    tokens = []
    for engine in (graphed, eager):
        requests = [
            make_request(engine.encode_chat(r["messages"]), f"r{i}", max_tokens=r["max_tokens"])
            for i, r in enumerate(rows)
        ]
        results = engine.generate(requests)
        tokens.append(
            {rid: [t for o in outs for t in o.new_token_ids] for rid, outs in results.items()}
        )
    assert tokens[0] == tokens[1]


@cuda
def test_padding_tokens_write_nothing_to_the_pool(make_engine: EngineFactory) -> None:
    engine = make_engine(device="cuda", dtype="float32", kv_cache_mib=512)
    runner = engine.runner
    before = [k[: runner.null_slot].clone() for k in runner.key_cache]
    # Three tokens pad to a bucket of four: the fourth writes only the scratch block.
    engine.generate([make_request([1, 2, 3], "pad", max_tokens=1)])
    changed = [
        torch.nonzero(
            (k[: runner.null_slot].view(torch.int32) != b.view(torch.int32)).any(-1).any(-1)
        )
        .flatten()
        .tolist()
        for k, b in zip(runner.key_cache, before, strict=True)
    ]
    # The prompt's three positions, in one block, and nothing else in any layer.
    block = engine.kv_cache.block_size
    assert all(len(c) == 3 and c[2] - c[0] == 2 and c[0] % block == 0 for c in changed)


@cuda
def test_adapter_rows_on_cuda_give_transformers_merged_output(
    make_engine: EngineFactory, model_path: str, tmp_path: Path
) -> None:
    """A step with LoRA rows runs the paged forward eagerly; base rows beside it replay."""
    from tests.lora_adapters import SPECS, make_adapter, merged_greedy

    spec = SPECS[0]
    adapter = make_adapter(model_path, spec, tmp_path)
    engine = make_engine(device="cuda", dtype="float32", kv_cache_mib=512, max_loras=2)
    texts = ("Write one line about the sea.", "Name a famous city.")
    prompts = [engine.encode_chat([{"role": "user", "content": t}]) for t in texts]
    lora = LoraRef(spec.name, str(adapter))
    requests = [make_request(p, max_tokens=12, lora=lora) for p in prompts]
    requests += [make_request(p, max_tokens=12) for p in prompts]
    results = engine.generate(requests)
    got = [[t for o in results[r.request_id] for t in o.new_token_ids] for r in requests]
    assert got[:2] == merged_greedy(model_path, adapter, prompts, 12)
    assert got[2:] == merged_greedy(model_path, None, prompts, 12)
