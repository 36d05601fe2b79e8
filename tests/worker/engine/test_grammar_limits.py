"""Grammar compilation is bounded: a large schema holds one compile thread, not the
others, and one past the time limit ends its requests with an error naming the limit
(xgrammar on the default model's tokenizer)."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from shared.models import FinishReason
from tests.worker.engine.factories import make_request
from tests.worker.engine.test_grammar import ScriptedGrammars, guided
from worker.engine import EngineRequest
from worker.engine.grammar import CompilingRequests, GrammarError, Grammars

SMALL = {"type": "object", "properties": {"a": {"type": "integer"}}}


def big_schema(num_branches: int) -> dict[str, Any]:
    """An anyOf of objects with patterned strings: slow to compile (a second or more)."""
    branches = [
        {
            "type": "object",
            "properties": {
                f"k{i}_{j}": {"type": "string", "pattern": f"^[a-z]{{{i % 7 + 1},{i % 11 + 9}}}$"}
                for j in range(6)
            },
            "required": [f"k{i}_{j}" for j in range(6)],
        }
        for i in range(num_branches)
    ]
    return {"anyOf": branches}


@pytest.fixture(scope="module")
def grammars(model_path: str) -> Grammars:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return Grammars(tokenizer, len(tokenizer), [tokenizer.eos_token_id], num_compile_threads=4)


def schema_request(request_id: str, schema: dict[str, Any]) -> EngineRequest:
    return make_request([1, 2, 3], request_id, guided_json=schema)


def test_a_small_schema_submitted_after_a_big_one_is_ready_first(grammars: Grammars) -> None:
    compiling = CompilingRequests(grammars, timeout_s=600)
    big, small = schema_request("big", big_schema(8)), schema_request("small", SMALL)
    assert compiling.add(big) is False
    assert compiling.add(small) is False
    ready: list[EngineRequest] = []
    while not ready:
        compiling.wait(0.05)
        ready, ended = compiling.take(0.0)
        assert ended == []
    assert ready == [small] and "big" in compiling  # the big one still compiles
    while "big" in compiling:
        compiling.wait(0.05)
        ready, _ = compiling.take(0.0)
    assert ready == [big] and big.grammar is not None


def test_a_schema_over_the_time_limit_ends_its_request_naming_the_limit(
    grammars: Grammars,
) -> None:
    compiling = CompilingRequests(grammars, timeout_s=0.2)
    slow = big_schema(9)
    compiling.add(schema_request("slow", slow))
    compiling.wait(0.3)
    ready, ended = compiling.take(0.0)
    assert ready == [] and len(compiling) == 0
    [out] = ended
    assert out.finish_reason is FinishReason.ERROR
    assert out.error is not None and "guided_json" in out.error and "limit of 0.2 s" in out.error
    with pytest.raises(GrammarError, match=r"limit of 0\.2 s"):  # refused at once from then on
        compiling.add(schema_request("again", slow))


def test_a_compile_no_request_waits_for_is_given_up() -> None:
    grammars = ScriptedGrammars()
    compiling = CompilingRequests(grammars)
    compiling.add(guided("a"))
    compiling.add(guided("b"))
    [future] = grammars.futures.values()
    compiling.abort("a", FinishReason.CANCELLED)
    assert not future.cancelled()  # "b" still waits for it
    compiling.abort("b", FinishReason.CANCELLED)
    assert future.cancelled()
