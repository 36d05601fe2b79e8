"""Embeddings per second: the engine against transformers batching sentences, in one run.

    python bench/embeddings.py                 # 256 texts, batches of 32 for the peer
    python bench/embeddings.py --num-texts 64  # a quick look

The engine gets every text at once (mean pooling, as it serves them); the peer is
what sentence-embedding libraries do: sort by length, pad batches of
``--batch-size``, one forward each, masked mean, normalise. Both run in this process
on the same device, so compare the ratio, not absolutes across runs. The largest
cosine gap between the two sets of vectors is printed as a check.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.models import SamplingParams
from worker.engine import Engine, EngineConfig, EngineRequest

WORDS = (
    "queue",
    "worker",
    "token",
    "batch",
    "cache",
    "block",
    "prefix",
    "model",
    "request",
    "priority",
    "stream",
    "redis",
    "gateway",
    "client",
    "adapter",
    "vector",
    "embedding",
    "search",
    "document",
    "answer",
    "question",
    "retrieval",
)


def texts(num: int, seed: int = 0) -> list[str]:
    """Sentences of 8 to 120 words, so lengths vary as real documents' do."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(8, 120))) + "." for _ in range(num)]


def engine_run(engine: Engine, items: list[str]) -> tuple[float, list[list[float]]]:
    requests = [
        EngineRequest(f"e{i}", engine.encode_prompt(t), SamplingParams(), task="embed")
        for i, t in enumerate(items)
    ]
    start = time.perf_counter()
    outputs = engine.generate(requests)
    wall_s = time.perf_counter() - start
    return wall_s, [list(outputs[r.request_id][-1].embedding or ()) for r in requests]


def peer_run(
    model: Any, tokenizer: Any, items: list[str], batch_size: int
) -> tuple[float, list[list[float]]]:
    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    vectors: dict[int, list[float]] = {}
    start = time.perf_counter()
    for at in range(0, len(order), batch_size):
        chunk = order[at : at + batch_size]
        batch = tokenizer([items[i] for i in chunk], padding=True, return_tensors="pt")
        with torch.inference_mode():
            hidden = model.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
        normed = torch.nn.functional.normalize(mean.float(), dim=-1)
        vectors.update(zip(chunk, normed.tolist(), strict=True))
    wall_s = time.perf_counter() - start
    return wall_s, [vectors[i] for i in range(len(items))]


def max_cosine_gap(a: list[list[float]], b: list[list[float]]) -> float:
    gaps = torch.nn.functional.cosine_similarity(torch.tensor(a), torch.tensor(b), dim=-1)
    return float(1 - gaps.min())


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from worker.model_store import resolve_model

    path = str(resolve_model(args.model))
    engine = Engine(EngineConfig(model=path, max_num_batched_tokens=args.max_num_batched_tokens))
    items = texts(args.num_texts)
    engine_run(engine, items[:4])  # warm-up
    engine_s, engine_vecs = engine_run(engine, items)
    tokenizer = engine.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    # The engine's model attends through the paged cache only; the peer loads its own.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=engine.runner.dtype).eval()
    peer_run(model, tokenizer, items[:4], args.batch_size)
    peer_s, peer_vecs = peer_run(model, tokenizer, items, args.batch_size)
    report = {
        "num_texts": len(items),
        "num_tokens": sum(len(engine.encode_prompt(t)) for t in items),
        "engine_embeddings_per_s": round(len(items) / engine_s, 1),
        f"transformers_batch{args.batch_size}_embeddings_per_s": round(len(items) / peer_s, 1),
        "engine_over_transformers": round(peer_s / engine_s, 2),
        "max_cosine_gap": max_cosine_gap(engine_vecs, peer_vecs),
    }
    print(json.dumps(report, indent=2))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--num-texts", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="the transformers peer's")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=EngineConfig.max_num_batched_tokens
    )
    parser.add_argument("--threads", type=int, default=None)
    return parser.parse_args()


if __name__ == "__main__":
    main()
