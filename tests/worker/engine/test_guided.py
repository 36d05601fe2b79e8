"""Constrained decoding on the real model: output that parses and fits its schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from shared.models import FinishReason, SamplingParams
from tests.worker.engine.factories import make_request
from worker.engine import Engine, RequestOutput

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


def chat(engine: Engine, text: str) -> list[int]:
    return engine.encode_chat([{"role": "user", "content": text}])


def text_of(outputs: list[RequestOutput]) -> str:
    return "".join(o.text for o in outputs)


def tokens_of(outputs: list[RequestOutput]) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]


def test_json_schema_output_fits_at_temperature_one(engine: Engine) -> None:
    prompts = ["Describe a person.", "Who is Ada?", "Tell me about your neighbour."]
    requests = [
        make_request(
            chat(engine, p),
            sampling=SamplingParams(temperature=1.0, seed=i, max_tokens=120, guided_json=PERSON),
        )
        for i, p in enumerate(prompts)
    ]
    results = engine.generate(requests)
    for request in requests:
        outputs = results[request.request_id]
        assert outputs[-1].finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(text_of(outputs)), PERSON)


def test_regex_output_matches(engine: Engine) -> None:
    sampling = SamplingParams(
        temperature=1.0, seed=5, max_tokens=30, guided_regex=r"[0-9]{3}-[a-z]{2}"
    )
    outputs = engine.generate([make_request(chat(engine, "A code?"), sampling=sampling)])
    text = text_of(next(iter(outputs.values())))
    assert len(text) == 6 and text[:3].isdigit() and text[3] == "-" and text[4:].isalpha()


def test_a_resumed_guided_request_continues_into_valid_json(engine: Engine) -> None:
    sampling = SamplingParams(temperature=1.0, seed=9, max_tokens=120, guided_json=PERSON)
    prompt = chat(engine, "Describe a person.")
    full = tokens_of(engine.generate([make_request(prompt, "whole", sampling=sampling)])["whole"])
    resumed = make_request(prompt, "resumed", sampling=sampling, output_token_ids=full[:5])
    rest = engine.generate([resumed])["resumed"]
    assert full[:5] + tokens_of(rest) == full
    text = str(engine.tokenizer.decode(full, skip_special_tokens=True))
    jsonschema.validate(json.loads(text), PERSON)


def test_a_schema_the_grammar_cannot_compile_ends_its_request_then_is_refused(
    engine: Engine,
) -> None:
    sampling = SamplingParams(guided_regex="(?<=a)b")
    request = make_request(chat(engine, "hi"), "bad", sampling=sampling)
    [output] = engine.generate([request])["bad"]
    assert output.finish_reason is FinishReason.ERROR
    assert output.error is not None and "Lookbehind is not supported" in output.error
    with pytest.raises(ValueError, match=r"guided_regex: .*Lookbehind is not supported"):
        engine.add_request(make_request(chat(engine, "hi"), sampling=sampling))


def test_guided_and_unguided_requests_share_the_engine(engine: Engine) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    plain = make_request(chat(engine, "Hi"), "plain", max_tokens=6, ignore_eos=True)
    sampling = SamplingParams(temperature=0.0, max_tokens=20, guided_json=schema)
    guided = make_request(chat(engine, "A number?"), "guided", sampling=sampling)
    results: dict[str, list[RequestOutput]] = {"plain": [], "guided": []}
    engine.add_request(plain)
    engine.add_request(guided)  # a schema not seen before: it compiles off the loop
    while engine.has_unfinished_requests():
        outputs = engine.step()
        if results["plain"] and not results["plain"][-1].finished:
            assert "plain" in [o.request_id for o in outputs]  # never held up by the compile
        for output in outputs:
            results[output.request_id].append(output)
    assert len(tokens_of(results["plain"])) == 6
    assert results["plain"][-1].finish_reason is FinishReason.LENGTH
    assert results["guided"][-1].finish_reason is FinishReason.STOP
    jsonschema.validate(json.loads(text_of(results["guided"])), schema)
