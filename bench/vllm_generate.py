"""vLLM's own ``LLM.generate``: the reference of the vLLM worker's tests and the "engine
alone" of ``bench/through_redis.py --engine vllm``. Run it in ``.venv-vllm``.

``python bench/vllm_generate.py MODEL_DIR CASES.jsonl OUT.json`` reads one case a line
(``messages`` or ``prompt``, and vLLM ``SamplingParams`` fields by their own names,
``structured_outputs`` as the keyword arguments of its ``StructuredOutputsParams``;
``lora``, an adapter's ``name`` and ``path``, runs the case with that ``LoRARequest``),
renders each prompt as a tokenq worker does (the same chat template through the same
tokenizer), runs them all through ``vllm.LLM.generate`` and writes, per case, its
prompt's ids, the tokens, text, chosen-token logprobs, finish reason and prompt
logprobs, with the seconds start-up and generation took. Engine arguments come as
``KEY=VALUE`` after the paths (JSON values), the same the worker under test is given.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def main(model_dir: str, cases_path: str, out_path: str, pairs: list[str]) -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import StructuredOutputsParams

    from worker.engine.prompt_tokens import encode_chat, encode_text
    from worker.vllm_engine.options import parse_pairs

    with open(cases_path) as lines:
        cases = [json.loads(line) for line in lines if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts: list[TokensPrompt] = []
    params = []
    loras: list[LoRARequest | None] = []
    lora_ids: dict[tuple[str, str], int] = {}
    for case in cases:
        if "messages" in case:
            ids = encode_chat(tokenizer, case["messages"])
        else:
            ids = encode_text(tokenizer, case["prompt"], add_special_tokens=True)
        prompts.append(TokensPrompt(prompt_token_ids=ids))
        fields = {k: v for k, v in case.items() if k not in ("messages", "prompt", "lora")}
        if "structured_outputs" in fields:
            fields["structured_outputs"] = StructuredOutputsParams(**fields["structured_outputs"])
        params.append(SamplingParams(**fields))
        lora = case.get("lora")
        if lora is None:
            loras.append(None)
        else:
            lora_id = lora_ids.setdefault((lora["name"], lora["path"]), len(lora_ids) + 1)
            loras.append(LoRARequest(lora["name"], lora_id, lora["path"]))
    started = time.monotonic()
    llm = LLM(model=model_dir, **parse_pairs(pairs))
    startup_s = time.monotonic() - started
    started = time.monotonic()
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    generate_s = time.monotonic() - started
    results = [_result(p["prompt_token_ids"], o) for p, o in zip(prompts, outputs, strict=True)]
    with open(out_path, "w") as out:
        json.dump({"startup_s": startup_s, "generate_s": generate_s, "results": results}, out)


def _result(prompt_token_ids: list[int], output: Any) -> dict[str, Any]:
    completion = output.outputs[0]
    chosen = None
    if completion.logprobs is not None:
        chosen = [
            entry[token_id].logprob
            for token_id, entry in zip(completion.token_ids, completion.logprobs, strict=True)
        ]
    return {
        "prompt_token_ids": list(prompt_token_ids),
        "token_ids": list(completion.token_ids),
        "text": completion.text,
        "logprobs": chosen,
        "finish_reason": completion.finish_reason,
        "prompt_logprobs": _prompt_logprobs(prompt_token_ids, output.prompt_logprobs),
    }


def _prompt_logprobs(prompt_token_ids: list[int], scores: Any) -> list[float | None] | None:
    """Each prompt token's logprob (the first's None), when the case asked for them."""
    if scores is None:
        return None
    return [
        None if entry is None else entry[t].logprob
        for t, entry in zip(prompt_token_ids, scores, strict=True)
    ]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
