"""A hybrid model's CUDA-graph step: steps of one-token rows over static buffers, each
row's state slot and fresh flag among them, padding rows on the scratch slot.

On the CPU the captured step itself cannot run, but everything it records can: the same
forward over the same static buffers (``StepGraphs.forward_static``, the paged Triton
kernel through its interpreter), standing in for every replay of a real engine's run,
whose tokens and logprobs must still be ``generate``'s. On a GPU (``-m cuda``) the
captured graphs replay, and equal the eager engine and ``generate``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from worker.engine import Engine, EngineConfig
from worker.engine.cuda_graphs import PagedBackend, StepGraphs
from worker.engine.step_inputs import StepInputs

GRAPHED = ["qwen3_5", "lfm2", "granitemoehybrid-dense"]


class UncapturedGraphs(StepGraphs):
    """What a replay does, without the capture: copy the step in, run the recorded
    forward over the static buffers. Counts each step's rows and bucket."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.steps: list[tuple[int, int]] = []

    def run(
        self, inputs: StepInputs, pending: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        size = self.load(inputs, pending)
        self.forward_static(size)
        self.steps.append((len(inputs.tables), size))
        assert self.logits is not None
        return self.logits[: len(inputs.sample_index)]


def check_static_path(name: str) -> None:
    """A tiny hybrid's decode steps through the graph path's static buffers on the CPU;
    its tokens and logprobs against ``generate``'s."""
    from tests.worker.engine.test_families import assert_matches, references, run
    from tests.worker.engine.tiny_models import SPECS_BY_NAME, save_tiny
    from worker.model_store import resolve_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out:
        path = save_tiny(SPECS_BY_NAME[name], Path(out), resolve_model("SmolLM2-135M-Instruct"))
        config = EngineConfig(
            model=str(path),
            device="cpu",
            kv_cache_mib=2,
            prefill_chunk_tokens=16,
            max_num_batched_tokens=40,
        )
        engine = Engine(config)
        runner = engine.runner
        backend = PagedBackend(runner.key_cache, runner.value_cache, runner.block_size)
        max_num_blocks = -(-runner.max_model_len // runner.block_size)
        graphs = UncapturedGraphs(
            runner.forward_fn,
            backend,
            runner.max_num_batched_tokens,
            8,
            max_num_blocks,
            runner.scratch_slot,
            runner.state_cache,
        )
        runner.graphs = graphs
        got = run(engine, num_prompts=3)  # steps of three rows pad to a bucket of four
        assert graphs.sizes[-1] == 8  # one-token rows only: buckets up to the batch's rows
        assert (3, 4) in graphs.steps and len(graphs.steps) >= 5, graphs.steps
        assert_matches(got, references(path)[:3])


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="the dev extra installs triton"
)
@pytest.mark.parametrize("name", GRAPHED)
def test_the_graph_steps_static_buffers_give_generates_tokens_on_the_cpu(name: str) -> None:
    # The interpreter takes over only where TRITON_INTERPRET is set before triton loads:
    # a process of its own.
    code = f"from {__name__} import check_static_path; check_static_path({name!r})"
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]


cuda = pytest.mark.cuda


@cuda
@pytest.mark.parametrize("name", GRAPHED)
def test_a_hybrid_on_cuda_replays_what_eager_and_generate_give(
    name: str, model_path: str, tmp_path: Path
) -> None:
    """fp32 tiny hybrids: decode steps replay captured graphs, prefill steps run eagerly;
    both equal the eager engine and ``generate``."""
    from tests.worker.engine.test_families import assert_matches, references, run
    from tests.worker.engine.tiny_models import SPECS_BY_NAME, save_tiny

    path = save_tiny(SPECS_BY_NAME[name], tmp_path, model_path)
    config = EngineConfig(model=str(path), device="cuda", dtype="float32", kv_cache_mib=64)
    graphed, eager = Engine(config), Engine(replace(config, enforce_eager=True))
    assert graphed.runner.graphs is not None and graphed.runner.graphs.state is not None
    got = run(graphed)
    assert [g.token_ids for g in got] == [g.token_ids for g in run(eager)]
    assert_matches(got, references(path), tolerance=1e-3)


@cuda
def test_a_hybrid_in_bf16_serves_through_graphs(model_path: str, tmp_path: Path) -> None:
    from tests.worker.engine.test_families import run
    from tests.worker.engine.tiny_models import SPECS_BY_NAME, save_tiny

    path = save_tiny(SPECS_BY_NAME["qwen3_5"], tmp_path, model_path)
    engine = Engine(EngineConfig(model=str(path), device="cuda", dtype="bfloat16", kv_cache_mib=64))
    assert engine.runner.graphs is not None  # and it passed the bf16 self-check
    assert all(len(g.token_ids) == 10 for g in run(engine))
