"""``--quantization int8`` and ``w8a8``: int8 projections on the CPU (with bf16 or 8-bit
activations), held to a dequantized reference on tiny models and to the fp32 engine
on the default model."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional

from shared.models import SamplingParams
from tests.lora_adapters import SPECS, make_adapter
from tests.worker.engine.conftest import NEEDS_W8A8, EngineFactory, TinyModels
from tests.worker.engine.factories import load_workload
from tests.worker.engine.quant_agreement import (
    Agreement,
    Steps,
    agreement,
    greedy_steps,
    workload_prompts,
)
from tests.worker.engine.tiny_models import (
    SPECS_BY_NAME,
    load_reference_model,
    prompts,
)
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.engine.errors import UnsupportedModel
from worker.engine.models.layers import Projection
from worker.engine.quantization import (
    MAX_INT8_ROWS,
    Int8Projection,
    quantize_projection,
)
from worker.engine.request import LoraRef
from worker.engine.runner_support import native_bf16
from worker.engine.self_check import W8A8_TOLERANCE, _engine_logits

pytestmark = pytest.mark.usefixtures("one_thread")
Prompts = list[tuple[list[int], int]]  # token ids and max_tokens (``workload_prompts``)

MAX_TOKENS = 12
# The int8 engine's logits against transformers' on the dequantized weights, as a
# share of the largest logit: the kernel takes and gives bf16 activations, so bf16's
# rounding, not the weights', sets this (the self-check allows the same); w8a8's
# 8-bit activations are coarser (measured up to 0.067 on these tiny models).
DEQUANTIZED_TOLERANCE = {"int8": 6e-2, "w8a8": W8A8_TOLERANCE}
# The default model on mixed32 (greedy, ignore_eos, up to 128 tokens) against the fp32
# engine: the share of requests whose tokens are identical, the share of tokens before
# each request's first difference, and the chosen token's logprob error over those.
# Measured 8/32 identical, 35% of tokens, error max 0.41 and mean 0.049 (AVX512 box);
# 6/32, 37%, 0.40 and 0.049 on an AVX2-only box: one flip at a near tie changes the
# rest of a long greedy continuation, so fp32 stays the default, and which requests
# meet such a tie moves with the CPU's kernels. Broken scales would share almost none.
MIN_SHARE_IDENTICAL = 0.125
MIN_SHARE_TOKENS = 0.3
MAX_LOGPROB_ERROR = 0.6
MAX_MEAN_LOGPROB_ERROR = 0.07
# w8a8 (8-bit activations too): measured 2/32 identical, 17.2% of tokens, error max 0.54
# and mean 0.080. Broken scales or a row quantized over another row's range would
# leave almost no token shared.
W8A8_MIN_SHARE_TOKENS = 0.12
W8A8_MAX_LOGPROB_ERROR = 0.8
W8A8_MAX_MEAN_LOGPROB_ERROR = 0.1


def dequantized_reference(path: Any) -> Any:
    """transformers' model with every projection and the LM head rounded to int8 with a
    scale (rounded to bf16) per output row, then widened back: what the int8 engine
    should compute, but for its activations' bf16 rounding."""
    model = load_reference_model(path)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and (name.endswith("proj") or name == "lm_head"):
                weight = module.weight
                scale = (weight.abs().amax(dim=1) / 127).to(torch.bfloat16).float()[:, None]
                weight.copy_(torch.round(weight / scale).clamp(-127, 127) * scale)
    return model


METHODS = ["int8", pytest.param("w8a8", marks=NEEDS_W8A8)]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["llama", "qwen3", "qwen3_moe", "gemma3"])
def test_int8_forward_equals_the_dequantized_reference(
    name: str, method: str, tiny_models: TinyModels
) -> None:
    path = tiny_models(SPECS_BY_NAME[name])
    config = EngineConfig(model=str(path), device="cpu", kv_cache_mib=2, quantization=method)
    runner = Engine(config).runner  # its start-up self-check passed
    probes = [prompt[:20] for prompt in prompts(2)]
    # A prefill beside another's first half, then decode steps of one and two rows: the
    # decode rows' projections read int8 (see worker.engine.self_check).
    got = _engine_logits(runner, probes).float()
    expected = torch.cat([_last_two(dequantized_reference(path), p) for p in probes])
    plain = torch.cat([_last_two(load_reference_model(path), p) for p in probes])
    scale = max(1.0, expected.abs().max().item())
    assert (got - expected).abs().max().item() / scale <= DEQUANTIZED_TOLERANCE[method]
    # The weights really are int8: the fp32 model's logits are further off.
    assert (got - plain).abs().max() > (got - expected).abs().max()


def _last_two(model: Any, prompt: list[int]) -> torch.Tensor:
    """The logits of the prompt's last token and of its decode token (its first token
    again, as the self-check's probe has it)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([[*prompt, prompt[0]]]), use_cache=False).logits
    return logits[0, -2:].float()  # type: ignore[no-any-return]


def test_a_projection_reads_int8_for_few_rows_and_the_same_weights_for_many() -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64), torch.randn(96)
    quantized = quantize_projection(Projection(weight.clone(), bias))
    assert isinstance(quantized, Int8Projection)
    assert quantized.int8.values.dtype == torch.int8
    assert quantized.int8.values.numel() == weight.numel()  # a byte a weight
    dequantized = quantized.int8.dequantize()
    assert (dequantized - weight).abs().max() <= weight.abs().amax(dim=1).max() / 127
    for rows in (1, MAX_INT8_ROWS, MAX_INT8_ROWS + 1, 64):
        x = torch.randn(rows, 64)
        expected = functional.linear(x, dequantized, bias)
        torch.testing.assert_close(quantized(x), expected, rtol=2e-2, atol=5e-2)


@NEEDS_W8A8
def test_w8a8_quantizes_each_row_over_its_own_range() -> None:
    torch.manual_seed(0)
    weight = torch.randn(96, 64)
    quantized = quantize_projection(Projection(weight.clone()), method="w8a8")
    assert isinstance(quantized, Int8Projection) and quantized.dynamic
    small, large = torch.randn(1, 64), 1000 * torch.randn(1, 64)
    alone = quantized(small)
    beside_a_large_row = quantized(torch.cat([small, large]))[:1]
    assert torch.equal(alone, beside_a_large_row)  # its range is its own
    expected = functional.linear(small, quantized.int8.dequantize())
    torch.testing.assert_close(alone, expected, rtol=0, atol=0.15)
    # The activations really are rounded to 8 bits: bf16 activations come closer.
    int8 = quantize_projection(Projection(weight.clone()))
    assert (alone - expected).abs().max() > (int8(small) - expected).abs().max()


@NEEDS_W8A8
def test_a_draft_models_w8a8_rows_share_one_range_and_one_call() -> None:
    torch.manual_seed(0)
    weight = torch.randn(96, 64)
    projection = quantize_projection(Projection(weight), method="w8a8", rows_apart=False)
    assert isinstance(projection, Int8Projection) and not projection.rows_apart
    small, large = torch.randn(1, 64), 1000 * torch.randn(1, 64)
    together = projection(torch.cat([small, large]))
    # One call over both rows: the small row is rounded to the large row's range.
    assert not torch.equal(together[:1], projection(small))
    projection.rows_apart = True
    assert torch.equal(projection(torch.cat([small, large]))[:1], projection(small))


def test_w8a8_is_refused_where_the_cpu_cannot_run_it(
    monkeypatch: pytest.MonkeyPatch, tiny_models: TinyModels
) -> None:
    from worker.engine import quantization

    monkeypatch.setattr(quantization, "w8a8_available", lambda: False)
    path = tiny_models(SPECS_BY_NAME["llama"])
    with pytest.raises(UnsupportedModel, match="w8a8 needs torch's fbgemm and a CPU with VNNI"):
        Engine(EngineConfig(model=str(path), device="cpu", kv_cache_mib=2, quantization="w8a8"))


def test_a_width_the_kernel_cannot_take_stays_unquantized() -> None:
    weight = torch.randn(8, 40)  # 40 inputs: not a multiple of 16
    projection = Projection(weight.clone())
    assert quantize_projection(projection) is projection
    assert torch.equal(projection.weight, weight)


@pytest.mark.slow
def test_lora_applies_on_a_quantized_base(
    make_engine: EngineFactory, model_path: str, tmp_path: Path
) -> None:
    adapter = make_adapter(model_path, SPECS[0], tmp_path)
    engine = make_engine(max_loras=1, quantization="int8")
    lora = LoraRef(SPECS[0].name, str(adapter))
    prompt = engine.encode_chat([{"role": "user", "content": "Write one line about the sea."}])
    got = _greedy(engine, prompt, lora)
    # Each token the engine chose is the best of transformers' merged model on the same
    # tokens before it, or within the int8 engine's tolerance of it (its activations are
    # rounded to bf16, so a near tie may go either way; the exact greedy sequence did).
    logits = _merged_on_dequantized(model_path, adapter, prompt, got)
    chosen = logits.gather(1, torch.tensor(got)[:, None])[:, 0]
    gaps = logits.max(dim=1).values - chosen
    scale = max(1.0, logits.abs().max().item())
    assert gaps.max().item() / scale <= DEQUANTIZED_TOLERANCE["int8"], gaps.tolist()
    assert got != _greedy(engine, prompt, None)  # the adapter changes the output


def _greedy(engine: Engine, prompt: list[int], lora: LoraRef | None) -> list[int]:
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    request = EngineRequest(f"lora-{lora is not None}", prompt, sampling, lora=lora)
    return [t for out in engine.generate([request])[request.request_id] for t in out.new_token_ids]


def _merged_on_dequantized(
    model_path: str, adapter: Path, prompt: list[int], tokens: list[int]
) -> torch.Tensor:
    """transformers' logits for each of ``tokens`` (after the prompt and the tokens before
    it) on the dequantized base with the adapter merged."""
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # peft reads deprecated attributes
        merged = PeftModel.from_pretrained(dequantized_reference(model_path), str(adapter))
        model = merged.merge_and_unload()
    ids = torch.tensor([[*prompt, *tokens]])
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits
    return logits[0, len(prompt) - 1 : len(prompt) - 1 + len(tokens)].float()  # type: ignore[no-any-return]


@pytest.mark.slow
def test_embeddings_of_the_int8_engine_are_close_to_fp32s(make_engine: EngineFactory) -> None:
    # Two tokens or so read int8 in their one step; the longer text, the dequantized weights.
    texts = ["Hello", "The cat sat on the mat, and the dog slept by the warm fire."]
    vectors = {}
    for method in (None, "int8"):
        engine = make_engine(quantization=method)
        requests = [
            EngineRequest(f"e{i}", engine.encode_prompt(t), SamplingParams(), task="embed")
            for i, t in enumerate(texts)
        ]
        results = engine.generate(requests)
        vectors[method] = [torch.tensor(results[r.request_id][-1].embedding) for r in requests]
    for fp32, int8 in zip(vectors[None], vectors["int8"], strict=True):
        assert functional.cosine_similarity(fp32, int8, dim=0) > 0.99


@pytest.fixture(scope="module")
def mixed32_fp32(make_engine: EngineFactory, tokenizer: Any) -> tuple[Prompts, list[Steps]]:
    """mixed32's prompts and the fp32 engine's greedy steps on them, the reference of
    every agreement test below (computed once)."""
    prompts_ = workload_prompts(tokenizer, load_workload("mixed32.jsonl"))
    return prompts_, greedy_steps(make_engine(), prompts_)


def against_fp32(
    mixed32_fp32: tuple[Prompts, list[Steps]],
    engine: Engine,
    name: str,
    capsys: pytest.CaptureFixture[str],
) -> Agreement:
    """``engine``'s agreement with fp32 on mixed32, printed."""
    prompts_, expected = mixed32_fp32
    result = agreement(expected, greedy_steps(engine, prompts_))
    with capsys.disabled():
        print(f"\n{name} against fp32 on mixed32: {result.summary()}")
    return result


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_default_model_in_int8_agrees_with_fp32_on_mixed32(
    make_engine: EngineFactory,
    mixed32_fp32: tuple[Prompts, list[Steps]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # At most four rows a step: the decode steps read int8 (more would read the
    # dequantized weights through the fp32 matmul).
    int8 = make_engine(quantization="int8", max_num_seqs=MAX_INT8_ROWS)
    result = against_fp32(mixed32_fp32, int8, "int8", capsys)
    assert result.share_identical >= MIN_SHARE_IDENTICAL
    assert result.share_tokens >= MIN_SHARE_TOKENS
    assert result.max_logprob_error <= MAX_LOGPROB_ERROR
    assert result.mean_logprob_error <= MAX_MEAN_LOGPROB_ERROR


@pytest.mark.slow
@pytest.mark.timeout(900)
@NEEDS_W8A8
def test_the_default_model_in_w8a8_agrees_with_fp32_on_mixed32(
    make_engine: EngineFactory,
    mixed32_fp32: tuple[Prompts, list[Steps]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    w8a8 = make_engine(quantization="w8a8", max_num_seqs=MAX_INT8_ROWS)
    result = against_fp32(mixed32_fp32, w8a8, "w8a8", capsys)
    assert result.share_tokens >= W8A8_MIN_SHARE_TOKENS
    assert result.max_logprob_error <= W8A8_MAX_LOGPROB_ERROR
    assert result.mean_logprob_error <= W8A8_MAX_MEAN_LOGPROB_ERROR


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not native_bf16(), reason="this CPU has no native bf16: bf16 is refused")
def test_the_default_model_in_bf16_agrees_with_fp32_on_mixed32(
    make_engine: EngineFactory,
    mixed32_fp32: tuple[Prompts, list[Steps]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = against_fp32(mixed32_fp32, make_engine(dtype="bfloat16"), "bf16", capsys)
    assert result.share_identical >= MIN_SHARE_IDENTICAL
    assert result.share_tokens >= MIN_SHARE_TOKENS
    assert result.max_logprob_error <= MAX_LOGPROB_ERROR
    assert result.mean_logprob_error <= MAX_MEAN_LOGPROB_ERROR
