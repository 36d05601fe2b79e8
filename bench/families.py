"""Model families through the engine at one size, as a ratio to Llama's, in one run.

    python bench/families.py                  # CPU: Llama, Qwen3, Mistral, Gemma 3, Qwen3-MoE,
                                              # and the hybrids Qwen3.5 and LFM2
    python bench/families.py --rounds 3       # more interleaved rounds (a noisy box)
    python bench/families.py --device cuda    # Qwen3, Qwen3.5, LFM2 at 256 sequences on graphs

Each family is a random-weight model of the same shape (hidden 256, 4 layers, 8 heads
of 32 with 4 KV heads, MLP 768, the default model's tokenizer and vocabulary; the
MoE model has 8 experts of 384, 2 active: the dense MLP's active size), built here
and saved to a temporary directory. Mistral slides a 64-token window on every layer
and Gemma 3 on three layers of four, so their windowed attention runs on mixed32's
contexts (up to ~170 tokens). The hybrids have one attention layer in four: Qwen3.5's
others are Gated DeltaNet (8 value heads of 32, 4 key heads), LFM2's short
convolutions (goal for them >= 0.7x; 0.85x for the rest). Figures are new tokens per
second over mixed32 (every request at once, greedy, ``ignore_eos``), fp32 on the CPU;
families run in turns, ``--rounds`` times, and each family's best round counts (the
box is shared). Each is given per second of wall time and per second of the process's
CPU time: on a shared box with ``--threads 1`` the CPU figure holds still while the
wall figure swings with the neighbours' load, so the ratios then come from it.

On CUDA (bf16) the models take the default model's shape instead (SmolLM2-135M:
hidden 576, 30 layers, 9 heads of 64 with 3 KV heads, MLP 1536; the hybrids' every
fourth layer attention), so that the GPU's work, not the host's, sets each figure, as
in ``bench/engine.py --device cuda``: at the tiny shape every family ran at 3-10% of its
ceiling and Qwen3's share against Llama's swung from 0.69x to 1.66x between two calls.
A Qwen3 model at 256 sequences (mixed32 ``--repeat`` times) replays CUDA graphs; it
prints the engine's tokens/s as a share of its graph ceiling, and the same for a Llama
model of the same shape in the same run, the families in turns ``--rounds`` times (the
best round counts); and the hybrids' tokens/s (their decode steps replay graphs, their
prefill steps run eagerly) as a ratio to Llama's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine import WORKLOADS, at_once, drain, graph_ceiling, load
from worker.engine import Engine, EngineConfig
from worker.model_store import resolve_model

SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
# The default model's shape, for the GPU (see the module docs).
GPU_SHAPE: dict[str, Any] = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}
WINDOW = 64
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "qwen3": ("qwen3", {}),
    "mistral": ("mistral", {"sliding_window": WINDOW}),
    "gemma3": (
        "gemma3_text",
        {
            "sliding_window": WINDOW,
            "layer_types": "sliding_attention",
            "query_pre_attn_scalar": 32,
        },
    ),
    "qwen3_moe": (
        "qwen3_moe",
        {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 384},
    ),
    "qwen3_5": (
        "qwen3_5_text",
        {
            "layer_types": "linear_attention",
            "linear_num_key_heads": 4,
            "linear_num_value_heads": 8,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
        },
    ),
    "lfm2": (
        "lfm2",
        {"layer_types": "conv", "block_auto_adjust_ff_dim": False},
    ),
}
HYBRIDS = frozenset({"qwen3_5", "lfm2"})


def build(name: str, out: Path, tokenizer_dir: Path, shape: dict[str, Any] = SHAPE) -> Path:
    """A random-weight model of ``name``'s family at ``shape``, saved at ``out``. A
    family's ``layer_types`` names the kind of three layers in four; the fourth attends
    to the whole context."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model_type, fields = FAMILIES[name]
    if "layer_types" in fields:
        kind, num_layers = fields["layer_types"], shape["num_hidden_layers"]
        layers = [kind if i % 4 != 3 else "full_attention" for i in range(num_layers)]
        fields = {**fields, "layer_types": layers}
    config = AutoConfig.for_model(
        model_type,
        **shape,
        **fields,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    path = out / name
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tokens_per_s(engine: Engine, items: list[Any]) -> tuple[float, float]:
    """New tokens per second of wall time and of this process's CPU time."""
    drain(engine, at_once(items[:8]))  # warm-up
    started_cpu_s = time.process_time()
    run = drain(engine, at_once(items))
    return run.num_tokens / run.wall_s, run.num_tokens / (time.process_time() - started_cpu_s)


def cpu_run(paths: dict[str, Path], args: argparse.Namespace) -> None:
    engines = {
        name: Engine(EngineConfig(model=str(path), kv_cache_mib=256, num_threads=args.threads))
        for name, path in paths.items()
    }
    items = load(WORKLOADS / "mixed32.jsonl", engines["llama"]) * args.repeat
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for round_no in range(args.rounds):
        for name, engine in engines.items():
            wall_tps, cpu_tps = tokens_per_s(engine, items)
            wall[name] = max(wall.get(name, 0.0), wall_tps)
            cpu[name] = max(cpu.get(name, 0.0), cpu_tps)
            print(f"round {round_no + 1}: {name}: {wall_tps:.1f} tok/s, {cpu_tps:.1f} tok/cpu-s")
    threads = torch.get_num_threads()
    print(f"mixed32 x {args.repeat}, {len(items)} requests; cpu float32, threads {threads}")
    report(wall, cpu, by_cpu=threads == 1)


def report(wall: dict[str, float], cpu: dict[str, float], by_cpu: bool) -> None:
    """Each family's best figures, and its ratio to Llama's (see the module docs)."""
    by = cpu if by_cpu else wall
    for name in wall:
        ratio = by[name] / by["llama"]
        least = 0.7 if name in HYBRIDS else 0.85
        goal = (
            "" if name == "llama" else f" (goal >= {least}x: {'met' if ratio >= least else 'not'})"
        )
        print(f"{name:10s} {wall[name]:8.1f} tok/s {cpu[name]:8.1f} tok/cpu-s  {ratio:.2f}x{goal}")
    print(f"(ratios to llama of tokens per {'CPU' if by_cpu else 'wall'} second)", flush=True)


CUDA_FAMILIES = ("llama", "qwen3", "qwen3_5", "lfm2")


def cuda_run(paths: dict[str, Path], args: argparse.Namespace) -> None:
    engines = {
        name: Engine(
            EngineConfig(model=str(paths[name]), device="cuda", max_num_seqs=256, kv_cache_mib=8192)
        )
        for name in CUDA_FAMILIES
    }
    speeds: dict[str, float] = {}
    for round_no in range(args.rounds):
        for name, engine in engines.items():
            items = load(WORKLOADS / "mixed32.jsonl", engine) * args.repeat
            rate, _ = tokens_per_s(engine, items)
            speeds[name] = max(speeds.get(name, 0.0), rate)
            print(f"round {round_no + 1}: {name}: {rate:.0f} tok/s", flush=True)
    shares = {}
    for name, engine in engines.items():
        ceiling = graph_ceiling(engine, engine.config.num_seqs)
        shares[name] = speeds[name] / ceiling
        print(
            f"{name}: {speeds[name]:.0f} tok/s, graph ceiling (256 rows, 128-token context) "
            f"{ceiling:.0f} tok/s: {100 * shares[name]:.0f}% of it ({torch.cuda.get_device_name()})"
        )
    print(f"qwen3's share of its ceiling is {shares['qwen3'] / shares['llama']:.2f}x llama's")
    for name in HYBRIDS:
        print(f"{name}: {speeds[name] / speeds['llama']:.2f}x llama's tokens/s through graphs")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per family")
    parser.add_argument("--repeat", type=int, default=None, help="mixed32 this many times")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    args = parser.parse_args()
    if args.repeat is None:
        args.repeat = 8 if args.device == "cuda" else 1
    names = list(CUDA_FAMILIES) if args.device == "cuda" else args.families.split(",")
    names = ["llama", *[n for n in names if n != "llama"]]
    tokenizer_dir = Path(resolve_model("SmolLM2-135M-Instruct"))
    with tempfile.TemporaryDirectory(prefix="tokenq-families-") as out:
        shape = GPU_SHAPE if args.device == "cuda" else SHAPE
        paths = {name: build(name, Path(out), tokenizer_dir, shape) for name in names}
        (cuda_run if args.device == "cuda" else cpu_run)(paths, args)


if __name__ == "__main__":
    main()
