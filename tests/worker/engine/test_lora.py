"""LoRA adapters on the real model: each request's output is transformers' with its
adapter merged, whatever else shares its batch, and eviction does not change it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.loras import read_rank
from tests.lora_adapters import SPECS, make_adapter, merged_greedy
from tests.worker.engine.conftest import EngineFactory
from tests.worker.engine.factories import make_request
from worker.engine import Engine, RequestOutput
from worker.engine.lora_weights import load_adapter
from worker.engine.request import LoraRef

MAX_TOKENS = 12
PROMPTS = ("Write one line about the sea.", "Name a famous city.")


@pytest.fixture(scope="session")
def adapters(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, LoraRef]:
    out = tmp_path_factory.mktemp("loras")
    return {s.name: LoraRef(s.name, str(make_adapter(model_path, s, out))) for s in SPECS}


def chat(engine: Engine, text: str) -> list[int]:
    return engine.encode_chat([{"role": "user", "content": text}])


def tokens_of(outputs: list[RequestOutput]) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def run(engine: Engine, prompt: list[int], lora: LoraRef | None, **kwargs: Any) -> list[int]:
    request = make_request(prompt, max_tokens=MAX_TOKENS, lora=lora, **kwargs)
    return tokens_of(engine.generate([request])[request.request_id])


@pytest.mark.parametrize("name", ["poet", "pirate"])
def test_output_equals_transformers_with_the_adapter_merged(
    make_engine: EngineFactory, adapters: dict[str, LoraRef], model_path: str, name: str
) -> None:
    engine = make_engine(max_loras=2)
    prompts = [chat(engine, text) for text in PROMPTS]
    got = [run(engine, p, adapters[name]) for p in prompts]
    assert got == merged_greedy(model_path, Path(adapters[name].path), prompts, MAX_TOKENS)
    assert got != [run(engine, p, None) for p in prompts]  # the adapter changes the output


def test_a_batch_mixing_adapters_and_the_base_gives_each_row_its_own_output(
    make_engine: EngineFactory, adapters: dict[str, LoraRef]
) -> None:
    engine = make_engine(max_loras=2)
    same, other = (chat(engine, text) for text in PROMPTS)
    rows = [
        (same, adapters["pirate"]),
        (same, adapters["clerk"]),
        (same, None),
        (other, adapters["pirate"]),
        (other, None),
    ]
    alone = [run(engine, prompt, lora) for prompt, lora in rows]
    assert len({tuple(tokens) for tokens in alone[:3]}) == 3  # one prompt, three answers
    batch = [make_request(prompt, max_tokens=MAX_TOKENS, lora=lora) for prompt, lora in rows]
    for request in batch:
        engine.add_request(request)
    outputs = engine.step()
    if engine.config.async_scheduling:  # that step's tokens come with the next call
        outputs += engine.step()
    assert {o.request_id for o in outputs} == {r.request_id for r in batch}  # one step
    while engine.has_unfinished_requests():
        outputs += engine.step()
    got = [tokens_of([o for o in outputs if o.request_id == r.request_id]) for r in batch]
    assert got == alone


def test_eviction_and_reload_keep_outputs_identical(
    make_engine: EngineFactory, adapters: dict[str, LoraRef]
) -> None:
    engine = make_engine(max_loras=1, enable_prefix_caching=False)
    store = engine.runner.lora
    assert store is not None
    prompt = chat(engine, PROMPTS[0])
    order = ["poet", "pirate", "clerk", "poet", "pirate"]
    loads = store.num_loads
    outputs = [run(engine, prompt, adapters[name]) for name in order]
    assert store.num_loads - loads == len(order)  # each evicted the one before it
    assert engine.resident_loras() == ["pirate"]
    assert outputs[3] == outputs[0]
    assert outputs[4] == outputs[1]


def test_a_preempted_or_resumed_request_keeps_its_adapter(
    make_engine: EngineFactory, adapters: dict[str, LoraRef]
) -> None:
    engine = make_engine(max_num_seqs=2, max_loras=2)
    prompts = [chat(engine, text) for text in (*PROMPTS, "About stars.")]
    loras = [adapters["poet"], adapters["pirate"], None]
    alone = [run(engine, p, lora, ignore_eos=True) for p, lora in zip(prompts, loras, strict=True)]
    low = [
        make_request(p, max_tokens=MAX_TOKENS, ignore_eos=True, lora=lora, priority=25)
        for p, lora in zip(prompts[:2], loras[:2], strict=True)
    ]
    for request in low:
        engine.add_request(request)
    outputs = engine.step()
    preemptions = engine.scheduler.num_preemptions
    critical = make_request(prompts[2], max_tokens=MAX_TOKENS, ignore_eos=True, priority=100)
    engine.add_request(critical)
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert engine.scheduler.num_preemptions > preemptions
    for request, expected in zip([*low, critical], alone, strict=True):
        assert tokens_of([o for o in outputs if o.request_id == request.request_id]) == expected
    head = alone[0][:5]
    resumed = run(engine, prompts[0], loras[0], ignore_eos=True, output_token_ids=head)
    assert head + resumed == alone[0]


def test_an_adapter_the_worker_cannot_serve_is_refused_with_the_reason(
    make_engine: EngineFactory, adapters: dict[str, LoraRef], tmp_path: Path
) -> None:
    engine = make_engine(max_loras=1, max_lora_rank=4)
    prompt = chat(engine, PROMPTS[0])
    with pytest.raises(ValueError, match="rank 8, over this worker's --max-lora-rank 4"):
        engine.add_request(make_request(prompt, lora=adapters["poet"]))
    missing = LoraRef("gone", str(tmp_path / "gone"))
    with pytest.raises(ValueError, match=r"no LoRA adapter at .*gone on this worker"):
        engine.add_request(make_request(prompt, lora=missing))
    assert not engine.has_unfinished_requests()
    assert run(engine, prompt, adapters["pirate"])  # rank 4 fits
    # What its claims pass on, so that it is not handed those in the first place.
    assert engine.lora_rank_limit() == 4
    assert make_engine(max_loras=0).lora_rank_limit() == 0


def test_the_registry_reads_the_rank_the_worker_counts(adapters: dict[str, LoraRef]) -> None:
    for spec in SPECS:
        path = adapters[spec.name].path
        assert read_rank(path) == load_adapter(path).rank == spec.rank
