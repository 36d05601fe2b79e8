"""A tokenq request as vLLM's: what maps, what is refused by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from shared.models import GUIDES, SamplingParams
from shared.refusal import RequestRefused
from tests.worker.engine.factories import make_request
from worker.engine.request import LoraRef
from worker.vllm_engine.mapping import (
    GENERATES_ONLY,
    POOLS_ONLY,
    STRUCTURED_OUTPUTS,
    LoraIds,
    check_embed,
    embedding_of,
    logprob_entry,
    prompt_logprob_entries,
    refuse_unmapped,
    sampling_kwargs,
    structured_outputs,
    vllm_priority,
)


@dataclass
class Lp:
    logprob: float
    rank: int | None


def test_sampling_fields_map_by_name() -> None:
    req = make_request(
        [1, 2, 3],
        sampling=SamplingParams(
            max_tokens=20,
            min_tokens=2,
            temperature=0.7,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            repetition_penalty=1.1,
            presence_penalty=0.5,
            frequency_penalty=0.25,
            logit_bias={5: -100.0},
            seed=11,
            stop=("END",),
            stop_token_ids=(9,),
            ignore_eos=True,
            logprobs=3,
        ),
    )
    kwargs = sampling_kwargs(req)
    assert kwargs == {
        "max_tokens": 20,
        "min_tokens": 2,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "logit_bias": {5: -100.0},
        "seed": 11,
        "stop_token_ids": [9],
        "ignore_eos": True,
        "logprobs": 3,
        "prompt_logprobs": None,
        "detokenize": False,  # stop strings are matched on tokenq's side
    }


def test_a_resumed_request_asks_only_for_what_it_has_left() -> None:
    req = make_request([1, 2], output_token_ids=[7, 8, 9], max_tokens=10, min_tokens=5)
    kwargs = sampling_kwargs(req)
    assert (kwargs["max_tokens"], kwargs["min_tokens"]) == (7, 2)


def test_a_higher_tokenq_priority_is_a_lower_vllm_value() -> None:
    assert vllm_priority(100) < vllm_priority(50) < vllm_priority(0)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"lora": LoraRef("a", "/adapters/a")}, "lora"),  # a worker started without LoRA
        (
            {"sampling": SamplingParams(guided_regex="[a-z]+"), "output_token_ids": [7]},
            "guided_regex",
        ),
    ],
)
def test_what_does_not_map_is_refused_by_name(kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestRefused) as refused:
        refuse_unmapped(make_request([1, 2], **kwargs), serves_lora=False)
    assert refused.value.refusal.param == param


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lora": LoraRef("a", "/adapters/a")},
        {"sampling": SamplingParams(guided_json={"type": "object"})},
        {"sampling": SamplingParams(guided_regex="[a-z]+")},
        {"sampling": SamplingParams(guided_structural_tag={"type": "structural_tag"})},
    ],
)
def test_structured_outputs_and_adapters_map(kwargs: dict[str, Any]) -> None:
    refuse_unmapped(make_request([1, 2], **kwargs), serves_lora=True)


def test_a_worker_serving_adapters_scores_no_prompts() -> None:
    # vLLM's engine core dies scoring a prompt beside another request with LoRA on.
    req = make_request([1, 2], sampling=SamplingParams(prompt_logprobs=1))
    with pytest.raises(RequestRefused) as refused:
        refuse_unmapped(req, serves_lora=True)
    assert refused.value.refusal.param == "prompt_logprobs"
    refuse_unmapped(req, serves_lora=False)


def test_every_guide_maps_to_vllms_structured_outputs() -> None:
    assert set(STRUCTURED_OUTPUTS) == set(GUIDES)
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {}}}
    assert structured_outputs(SamplingParams(guided_json=schema)) == {
        "json": '{"type":"object","properties":{"b":{"type":"integer"},"a":{}}}'  # unsorted
    }
    assert structured_outputs(SamplingParams(guided_json={})) == {"json": "{}"}  # any JSON
    assert structured_outputs(SamplingParams(guided_regex="a|b")) == {"regex": "a|b"}
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}
    assert structured_outputs(SamplingParams(guided_structural_tag=tag)) == {
        "structural_tag": '{"type":"structural_tag","format":{"type":"const_string","value":"x"}}'
    }
    assert structured_outputs(SamplingParams()) is None


def test_each_adapter_at_each_path_has_its_own_vllm_id() -> None:
    ids = LoraIds()
    first = ids.id_of(LoraRef("a", "/adapters/a"))
    assert first >= 1  # vLLM refuses 0
    assert ids.id_of(LoraRef("a", "/adapters/a")) == first
    others = ids.id_of(LoraRef("b", "/adapters/b")), ids.id_of(LoraRef("a", "/v2/a"))
    assert len({first, *others}) == 3


def test_logprobs_keep_the_chosen_token_and_the_top_in_rank_order() -> None:
    entry = {4: Lp(-2.5, 3), 1: Lp(-0.1, 1), 2: Lp(-1.0, 2)}
    assert logprob_entry(4, entry, 2) == {
        "token_id": 4,
        "logprob": -2.5,
        "top": [{"token_id": 1, "logprob": -0.1}, {"token_id": 2, "logprob": -1.0}],
    }
    assert logprob_entry(1, {1: Lp(-0.1, 1)}, 0)["top"] == []


def test_scoring_the_prompt_alone_asks_vllm_for_one_token_and_the_prompt_logprobs() -> None:
    kwargs = sampling_kwargs(make_request([1, 2], sampling=SamplingParams(
        max_tokens=0, prompt_logprobs=2)))  # fmt: skip
    assert (kwargs["max_tokens"], kwargs["prompt_logprobs"]) == (1, 2)


NAMES = {t: (f"<{t}>", None) for t in range(10)}


def test_prompt_logprobs_are_tokenqs_entries_over_the_prompt_alone() -> None:
    scores = [
        None,
        {5: Lp(-0.5, 1), 6: Lp(-1.5, 2)},
        {7: Lp(-3.0, 4), 1: Lp(-0.2, 1), 2: Lp(-0.9, 2)},
        {9: Lp(-0.1, 1)},  # a kept token of a resumed request: not the prompt's
    ]
    entries = prompt_logprob_entries([4, 5, 7], scores, 2, NAMES)
    assert entries[0] == {"token_id": 4, "logprob": None, "top": [], "token": "<4>"}
    assert entries[1]["rank"] == 1 and entries[1]["logprob"] == -0.5
    assert entries[2] == {
        "token_id": 7,
        "logprob": -3.0,
        "rank": 4,
        "token": "<7>",
        "top": [
            {"token_id": 1, "logprob": -0.2, "token": "<1>"},
            {"token_id": 2, "logprob": -0.9, "token": "<2>"},
        ],
    }
    assert len(entries) == 3
    with pytest.raises(ValueError, match="do not cover the 3 prompt tokens"):
        prompt_logprob_entries([4, 5, 7], scores[:2], 2, NAMES)


def test_a_generating_worker_refuses_embeddings_and_a_pooling_one_generation() -> None:
    with pytest.raises(RequestRefused, match="computes no embeddings") as refused:
        refuse_unmapped(make_request([1, 2], task="embed"), serves_lora=False)
    assert (refused.value.refusal.param, str(refused.value)) == ("task", GENERATES_ONLY)
    with pytest.raises(RequestRefused, match="embeddings only") as refused:
        refuse_unmapped(make_request([1, 2]), serves_lora=False, pools=True)
    assert (refused.value.refusal.param, str(refused.value)) == ("task", POOLS_ONLY)


def test_each_worker_takes_its_own_task() -> None:
    refuse_unmapped(make_request([1, 2]), serves_lora=False)
    refuse_unmapped(make_request([1, 2], task="embed", dimensions=4), serves_lora=False, pools=True)


def test_an_embedding_is_vllms_vector_normalised_whole() -> None:
    assert embedding_of([0.6, 0.8], None) == pytest.approx([0.6, 0.8])
    assert embedding_of([3.0, 4.0], None) == pytest.approx([0.6, 0.8])


def test_dimensions_keep_the_first_values_normalised_again() -> None:
    vector = [0.5, 0.5, 0.5, 0.5]
    kept = embedding_of(vector, 2)
    assert kept == pytest.approx([2**-0.5, 2**-0.5])
    assert sum(v * v for v in kept) == pytest.approx(1.0)


def test_a_zero_vector_stays_zero() -> None:
    assert embedding_of([0.0, 0.0, 0.0], 2) == [0.0, 0.0]


def test_an_embed_request_is_bounded_as_the_built_in_engine_bounds_it() -> None:
    check_embed(make_request([1] * 7, task="embed", dimensions=8), 8, 8)
    with pytest.raises(RequestRefused, match="the text to embed is 8 tokens") as refused:
        check_embed(make_request([1] * 8, task="embed"), 8, 8)
    assert refused.value.refusal.param == "prompt"
    with pytest.raises(RequestRefused, match="ask for 8 or fewer") as refused:
        check_embed(make_request([1], task="embed", dimensions=9), 8, 8)
    assert refused.value.refusal.param == "dimensions"
