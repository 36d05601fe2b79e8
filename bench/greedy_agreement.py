"""Greedy output through the engine against transformers' ``generate`` on each
request alone, on any device and dtype, all of the workload in flight together.

    python bench/greedy_agreement.py                 # mixed32 on the engine's device
    python bench/greedy_agreement.py --device cuda   # bf16 on a GPU

On the CPU in fp32 this is a test (``tests/worker/engine/test_engine_greedy.py``);
in bf16 the two sides' kernels round differently and near ties flip more often, so
this prints, for each request whose output departs from ``generate``'s, the step
where it does and the gap between the two best logits there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.models import SamplingParams
from tests.worker.engine.reference import Reference, greedy_references
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.model_store import resolve_model

WORKLOADS = Path(__file__).resolve().parent / "workloads"


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def first_difference(tokens: list[int], ref: Reference) -> int | None:
    for step, (got, expected) in enumerate(zip(tokens, ref.token_ids, strict=True)):
        if got != expected:
            return step
    return None


def main() -> None:
    args = parse_args()
    model_path = str(resolve_model(args.model))
    engine = Engine(EngineConfig(model=model_path, device=args.device, dtype=args.dtype))
    rows = [json.loads(line) for line in Path(args.workload).read_text().splitlines() if line]
    refs = greedy_references(model_path, rows, str(engine.runner.device), engine.runner.dtype)
    requests = [
        EngineRequest(f"r{i}", ref.prompt_token_ids, greedy(len(ref.token_ids)))
        for i, ref in enumerate(refs)
    ]
    results = engine.generate(requests)
    dtype = str(engine.runner.dtype).removeprefix("torch.")
    print(f"{Path(args.workload).name} on {engine.runner.device} in {dtype}:")
    same = 0
    for req, ref in zip(requests, refs, strict=True):
        tokens = [t for out in results[req.request_id] for t in out.new_token_ids]
        step = first_difference(tokens, ref)
        if step is None:
            same += 1
            continue
        best, best_logit, second, second_logit = ref.top2[step]
        top2 = "one of generate's top two" if tokens[step] in (best, second) else "NOT top two"
        print(
            f"  {req.request_id}: departs at step {step}/{len(ref.token_ids)}, engine took "
            f"{tokens[step]} ({top2}); generate's top two logits differ by "
            f"{best_logit - second_logit:.3g} there"
        )
    print(f"token-identical: {same}/{len(requests)} requests")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default=str(WORKLOADS / "mixed32.jsonl"))
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    return parser.parse_args()


if __name__ == "__main__":
    main()
