"""vLLM's own ``LLM.embed``: the reference of the pooling vLLM worker's tests. Run it in
``.venv-vllm``.

``python bench/vllm_embed.py MODEL_DIR TEXTS.json OUT.json [KEY=VALUE ...]`` reads a JSON
list of texts, tokenizes each as a tokenq worker does (the same tokenizer, its special
tokens), embeds them all through ``vllm.LLM.embed`` with the engine arguments given
(JSON values; ``pooler_config`` as a mapping), and writes per text its prompt's ids and
vLLM's vector.
"""

from __future__ import annotations

import json
import os
import sys


def main(model_dir: str, texts_path: str, out_path: str, pairs: list[str]) -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, TokensPrompt

    from worker.engine.prompt_tokens import encode_text
    from worker.vllm_engine.options import parse_pairs

    with open(texts_path) as f:
        texts = json.load(f)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = [encode_text(tokenizer, text, add_special_tokens=True) for text in texts]
    llm = LLM(model=model_dir, **parse_pairs(pairs))
    outputs = llm.embed([TokensPrompt(prompt_token_ids=i) for i in ids], use_tqdm=False)
    results = [
        {"prompt_token_ids": i, "embedding": list(o.outputs.embedding)}
        for i, o in zip(ids, outputs, strict=True)
    ]
    with open(out_path, "w") as out:
        json.dump({"results": results}, out)
    del llm  # vLLM shuts its engine core down here
    # The pooling runner leaves a native thread joinable, and the interpreter's own exit
    # then aborts ("terminate called without an active exception", exit -6) in about
    # two runs of three: the results are written, so leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
