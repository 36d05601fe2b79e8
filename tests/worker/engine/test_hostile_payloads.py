"""Random and extreme request payloads, through the wire schema and into the real
engine (the default model) as the worker admits them: every payload is refused with an
error that says what was wrong, or runs; none ends the engine."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from shared.models import FinishReason, GenerationRequest, dumps
from shared.settings import Settings
from worker.admission import engine_request
from worker.engine import Engine
from worker.held import Held

EDGE_INTS = [0, 1, 2, 8191, 8192, 49151, 49152, 2**31, 2**53, 2**63 - 1, 2**63, 2**64, -1, -(2**63)]
EDGE_FLOATS = [0.0, 1e-45, 1e-39, 1e-30, 1e-4, 1e-3, 0.5, 1.0, 2.0, 100.0, 1e308, -1e-3]

ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-(2**70), 2**70), st.integers(0, 64))
floats = st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=True, allow_infinity=True))


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


SCHEMAS = [
    {"type": "object"},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "definitely-not-a-type"},
    {"$ref": "#/nowhere"},
    nested(40),
    nested(300),
    {"enum": []},
]
REGEXES = ["[ab]+", "(", "a{0,99999}", r"\d{3}-\d{2}", "[z-a]", "(?<=a)b", ".*"]

SAMPLING = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": ints,
        "min_tokens": ints,
        "temperature": floats,
        "top_p": floats,
        "top_k": ints,
        "min_p": floats,
        "repetition_penalty": floats,
        "presence_penalty": floats,
        "frequency_penalty": floats,
        "seed": ints,
        "logprobs": ints,
        "ignore_eos": st.booleans(),
        "stop_token_ids": st.lists(ints, max_size=3),
        "logit_bias": st.dictionaries(ints, floats, max_size=3),
        "stop": st.lists(st.text(max_size=4), max_size=2),
        "guided_json": st.sampled_from(SCHEMAS),
        "guided_regex": st.sampled_from(REGEXES),
    },
)
PROMPTS = st.one_of(
    st.fixed_dictionaries({"prompt": st.text(max_size=40)}),
    st.fixed_dictionaries({"prompt_token_ids": st.lists(ints, min_size=0, max_size=6)}),
    st.fixed_dictionaries({"prompt_token_ids": st.sampled_from([[1] * 9000, [5] * 100])}),
)
PAYLOADS = st.builds(
    lambda prompt, sampling, extra: {"model": "m", **prompt, "sampling": sampling, **extra},
    PROMPTS,
    SAMPLING,
    st.fixed_dictionaries(
        {},
        optional={
            "deadline_ms": ints,
            "priority": ints,
            "metadata": st.dictionaries(st.text(max_size=3), ints, max_size=2),
        },
    ),
)
ids = itertools.count()
MAX_STEPS = 4  # enough to admit, compile, prefill and sample; then it is aborted


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(payload=PAYLOADS)
def test_no_payload_ends_the_engine(engine: Engine, payload: dict[str, Any]) -> None:
    request = validated(payload)
    if isinstance(request, str):
        assert "validation error" in request  # refused by the schema, naming the field
        return
    # What a submit writes to Redis, and the worker reads back, is the same request.
    assert GenerationRequest.model_validate_json(dumps(request)) == request
    request_id = f"hostile-{next(ids)}"
    refusal = admitted(engine, request, request_id)
    if refusal is not None:
        assert ": " in refusal  # refused, saying why
        return
    outputs = []
    for _ in range(MAX_STEPS):
        outputs += engine.step()
        if any(o.finished for o in outputs):
            break
    engine.abort_request(request_id)
    outputs += engine.step()  # the abort's own output
    while engine.has_unfinished_requests():
        outputs += engine.step()
    [final] = [o for o in outputs if o.finished]
    assert final.request_id == request_id
    assert final.finish_reason is not FinishReason.ERROR or final.error


def validated(payload: dict[str, Any]) -> GenerationRequest | str:
    try:
        return GenerationRequest.model_validate(payload)
    except ValidationError as e:
        return str(e)


def admitted(engine: Engine, request: GenerationRequest, request_id: str) -> str | None:
    """As the worker admits it (no adapter: the queue is asked only for its settings,
    which give the cache salt); the refusal, if any."""
    held = Held(request_id, "lease", request)
    queue = cast(Any, SimpleNamespace(settings=Settings()))
    try:
        engine.add_request(engine_request(engine, queue, held))
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize(
    ("sampling", "says"),
    [
        ({"top_k": 2**64}, "top_k"),
        ({"stop_token_ids": [2**40], "min_tokens": 1}, "stop_token_ids"),
        ({"temperature": 1e-39}, "temperature"),
        ({"guided_json": nested(300)}, "guided_json"),
    ],
)
def test_extreme_values_are_refused_by_the_schema_naming_the_field(
    sampling: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValidationError, match=says):
        GenerationRequest.model_validate({"model": "m", "prompt": "hi", "sampling": sampling})
