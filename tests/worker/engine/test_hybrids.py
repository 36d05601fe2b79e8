"""Hybrid models (state layers beside attention) through the engine on tiny random-weight
models, against transformers' ``generate`` on each prompt alone (tokens equal, logprobs
within 1e-4 in fp32): prompts batched together, prefilled in chunks of 16 beside other
rows' decodes, preempted under a small budget, resumed after an abort mid-answer, and
from state slots that held anything before. Each model's state layers matter: its
``generate`` with their state dropped before each decode step gives other tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.models import SamplingParams
from tests.worker.engine.conftest import TinyModels
from tests.worker.engine.test_families import (
    LOGPROB_TOLERANCE,
    MAX_TOKENS,
    assert_features_matter,
    assert_matches,
    references,
    run,
)
from tests.worker.engine.tiny_models import (
    HYBRID_SPECS,
    Greedy,
    TinySpec,
    greedy,
    load_reference_model,
    prompts,
)
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.engine.models.decoder import DecoderModel

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
IDS = [spec.name for spec in HYBRID_SPECS]

_references: dict[str, list[Greedy]] = {}


def expected(spec: TinySpec, path: Path) -> list[Greedy]:
    """``generate``'s tokens per prompt, once per spec (and its state shown to matter)."""
    if spec.name not in _references:
        _references[spec.name] = references(path)
        assert_features_matter(spec, path, _references[spec.name])
    return _references[spec.name]


def engine(path: Path, **config: Any) -> Engine:
    return Engine(EngineConfig(model=str(path), device="cpu", **{"kv_cache_mib": 2, **config}))


@pytest.mark.parametrize("spec", HYBRID_SPECS, ids=IDS)
def test_a_hybrid_gives_generates_tokens_batched_and_chunked(
    spec: TinySpec, tiny_models: TinyModels
) -> None:
    path = tiny_models(spec)
    batched = engine(path)
    assert isinstance(batched.runner.forward_fn, DecoderModel)  # the fused forward
    assert batched.runner.forward_fn.state_mixers and batched.runner.state_cache is not None
    assert not batched.kv_cache.enable_prefix_caching  # said so in the log
    assert_matches(run(batched), expected(spec, path))  # every prompt in one batch
    assert_matches(run(batched), expected(spec, path))  # again, in slots used before
    # Chunks of 16 in steps of 40 tokens: chunks of two prompts and decode rows together.
    chunked = engine(path, prefill_chunk_tokens=16, max_num_batched_tokens=40)
    assert_matches(run(chunked), expected(spec, path))


@pytest.mark.parametrize("spec", HYBRID_SPECS, ids=IDS)
def test_a_hybrid_preempted_for_want_of_blocks_gives_generates_tokens(
    spec: TinySpec, tiny_models: TinyModels
) -> None:
    path = tiny_models(spec)
    small = engine(path, kv_cache_mib=1, max_num_seqs=4, prefill_chunk_tokens=16)
    assert_matches(run(small), expected(spec, path))
    assert small.scheduler.num_preemptions > 0


@pytest.mark.parametrize("spec", HYBRID_SPECS, ids=IDS)
def test_a_hybrid_starts_each_sequence_from_zeros_whatever_its_slot_held(
    spec: TinySpec, tiny_models: TinyModels
) -> None:
    """Slots full of NaN (what no product with a mask would clear): the prompts, and
    a one-token prompt whose first step is a decode row, give ``generate``'s tokens."""
    path = tiny_models(spec)
    stale = engine(path)
    assert stale.runner.state_cache is not None
    for pool in stale.runner.state_cache.pools:
        for tensor in pool:
            tensor.fill_(float("nan"))
    assert_matches(run(stale), expected(spec, path))
    one_token = [prompts()[0][0]]
    reference = greedy(load_reference_model(path), one_token, MAX_TOKENS)
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=0)
    outputs = stale.generate([EngineRequest("one", one_token, sampling)])["one"]
    tokens = [t for out in outputs for t in out.new_token_ids]
    logprobs = [e["logprob"] for out in outputs for e in out.logprobs or ()]
    assert_matches([Greedy(tokens, logprobs)], [reference])


@pytest.mark.parametrize("spec", HYBRID_SPECS, ids=IDS)
def test_a_hybrid_resumed_after_an_abort_mid_answer_continues_exactly(
    spec: TinySpec, tiny_models: TinyModels
) -> None:
    """Each request is aborted a few tokens in (its worker died); resumed from its
    prompt and the tokens published, the state is computed again and the rest of the
    answer is ``generate``'s, on the same engine whose slots the aborted ones held."""
    path = tiny_models(spec)
    refs = expected(spec, path)
    served = engine(path, prefill_chunk_tokens=16, max_num_batched_tokens=40)
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=0)
    published: dict[str, list[int]] = {f"p{i}": [] for i in range(len(refs))}
    for i, prompt in enumerate(prompts()):
        served.add_request(EngineRequest(f"p{i}", prompt, sampling))
    while min(len(tokens) for tokens in published.values()) < 3:
        for out in served.step():
            published[out.request_id] += out.new_token_ids
    for request_id in published:
        served.abort_request(request_id)
    served.step()
    assert not served.has_unfinished_requests()
    assert len({len(tokens) for tokens in published.values()}) > 1  # aborted at several points
    resumed = [
        EngineRequest(f"{request_id}-resumed", prompt, sampling, output_token_ids=list(tokens))
        for (request_id, tokens), prompt in zip(published.items(), prompts(), strict=True)
    ]
    results = served.generate(resumed)
    for request, ref in zip(resumed, refs, strict=True):
        head = request.output_token_ids
        tokens = [t for out in results[request.request_id] for t in out.new_token_ids]
        logprobs = [e["logprob"] for out in results[request.request_id] for e in out.logprobs or ()]
        assert head + tokens == ref.token_ids
        worst = max(abs(a - b) for a, b in zip(logprobs, ref.logprobs[len(head) :], strict=True))
        assert worst <= LOGPROB_TOLERANCE


def test_a_qwen3_5_checkpoint_as_published_serves_its_text_model(
    model_path: str, tmp_path: Path
) -> None:
    """Qwen3.5 is published as its multimodal model (``qwen3_5``): the worker loads
    its text model, with the checkpoint's weights, and serves it as ``generate`` does."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen3_5ForConditionalGeneration

    from tests.worker.engine.tiny_models import BASE, GATED_DELTANET

    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2}
    config: Any = AutoConfig.for_model(
        "qwen3_5", text_config={**BASE, **GATED_DELTANET}, vision_config=vision
    )
    torch.manual_seed(0)
    published: Any = Qwen3_5ForConditionalGeneration(config)
    published.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(tmp_path)
    served = engine(tmp_path)
    assert served.runner.family is not None and served.runner.family.name == "qwen3_5"
    saved = published.model.language_model.layers[0].linear_attn.in_proj_z.weight
    loaded = served.runner.model.get_decoder().layers[0].linear_attn.in_proj_z.weight
    assert torch.equal(saved, loaded)
    assert_matches(run(served), references(tmp_path))
