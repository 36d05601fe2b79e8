"""The CUDA step: flattened inputs and buckets (on any machine), and the captured
graphs themselves (marked ``cuda``: they run where a GPU is, ``pytest -m cuda``, and
are deselected elsewhere). The paged kernel's own tests are in ``test_paged_attention``."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.worker.engine.conftest import EngineFactory
from tests.worker.engine.factories import load_workload, make_request
from worker.engine import Engine, EngineConfig
from worker.engine.cuda_graphs import graph_sizes
from worker.engine.outputs import ScheduledSeq
from worker.engine.request import LoraRef, Sequence
from worker.engine.step_inputs import StepInputs


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
    inputs = StepInputs.build([decode, chunk], block_size=16)
    assert inputs.token_ids == [20, *range(17, 25)]
    assert inputs.positions == [19, *range(16, 24)]
    assert inputs.slot_mapping == [3 * 16 + 3, *(9 * 16 + p for p in range(8))]
    assert inputs.token_row == [0] + [1] * 8
    assert inputs.sample_index == [0]
    assert inputs.padded_tables().tolist() == [[7, 3, 0], [5, 9, 2]]
    assert inputs.row_starts == [0, 1] and inputs.row_num_tokens == [1, 8]
    assert inputs.rope_lens is None  # only for rotaries that change with length


cuda = pytest.mark.cuda


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


@cuda
@pytest.mark.parametrize("name", ["qwen3", "gemma3", "gemma2", "gpt_oss"])
def test_other_families_on_cuda_replay_what_eager_and_generate_give(
    name: str, model_path: str, tmp_path: Path
) -> None:
    """fp32 tiny models: graph replay equals the eager paged forward, and both equal
    transformers' ``generate`` (windows, soft-caps and sinks in the paged kernel).
    gpt-oss's MoE layers run eagerly in fp32 (graphs need bf16 on Hopper for them)."""
    from tests.worker.engine.test_families import assert_matches, references, run
    from tests.worker.engine.tiny_models import SPECS_BY_NAME, save_tiny

    path = save_tiny(SPECS_BY_NAME[name], tmp_path, model_path)
    config = EngineConfig(model=str(path), device="cuda", dtype="float32", kv_cache_mib=64)
    graphed, eager = Engine(config), Engine(replace(config, enforce_eager=True))
    assert (graphed.runner.graphs is not None) == (name != "gpt_oss")
    got = run(graphed)
    assert [g.token_ids for g in got] == [g.token_ids for g in run(eager)]
    assert_matches(got, references(path), tolerance=1e-3)


@cuda
def test_a_moe_model_in_bf16_captures_graphs_where_the_grouped_matmul_allows(
    model_path: str, tmp_path: Path
) -> None:
    from tests.worker.engine.test_families import run
    from tests.worker.engine.tiny_models import SPECS_BY_NAME, save_tiny

    path = save_tiny(SPECS_BY_NAME["qwen3_moe"], tmp_path, model_path)
    engine = Engine(EngineConfig(model=str(path), device="cuda", dtype="bfloat16", kv_cache_mib=64))
    hopper = torch.cuda.get_device_capability()[0] in (9, 10)
    assert (engine.runner.graphs is not None) == hopper  # and it passed the bf16 self-check
    assert all(len(g.token_ids) == 10 for g in run(engine))
