"""One stream on vLLM's engine, for ``bench/latency.py --vllm``: run in ``.venv-vllm``.

``python bench/vllm_stream.py MODEL_DIR [KEY=VALUE ...]`` starts ``vllm.LLM`` once (engine
arguments as ``KEY=VALUE``, JSON values, as ``bench/vllm_generate.py`` takes them), prints
``ready``, then serves one request per line of stdin: ``{"prompt_token_ids": [...],
"max_tokens": N}``, run greedily to exactly N tokens by stepping the engine as
``LLM.generate`` does, answered with one line: ``{"whole": tok/s, "decode": tok/s,
"num_tokens": N}``, tokens/s over the whole request and over its decode (after the
first token), as ``bench/latency.py`` times the built-in engine.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def one_stream(engine: Any, request_id: str, ids: list[int], max_tokens: int) -> dict[str, Any]:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    engine.add_request(request_id, TokensPrompt(prompt_token_ids=ids), params)
    first, num_tokens = None, 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            num_tokens = len(output.outputs[0].token_ids)
            if first is None and num_tokens:
                first = time.perf_counter()
    ended = time.perf_counter()
    if first is None:
        raise RuntimeError(f"request {request_id}: no token came back")
    return {
        "whole": num_tokens / (ended - started),
        "decode": (num_tokens - 1) / max(ended - first, 1e-9),
        "num_tokens": num_tokens,
    }


def main(model_dir: str, pairs: list[str]) -> None:
    from vllm import LLM

    from worker.vllm_engine.options import parse_pairs

    engine = LLM(model=model_dir, **parse_pairs(pairs)).llm_engine
    print("ready", flush=True)
    for number, line in enumerate(sys.stdin):
        ask = json.loads(line)
        reply = one_stream(engine, f"one-{number}", ask["prompt_token_ids"], ask["max_tokens"])
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
