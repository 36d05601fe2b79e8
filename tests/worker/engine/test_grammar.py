"""Grammars compiled off the step loop: requests wait for theirs outside the scheduler.

A scripted ``Grammars`` stands in for xgrammar: each compile is a future the test
completes by hand, so what waits and what joins is seen step by step.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import pytest

from shared.models import FinishReason, SamplingParams
from tests.worker.engine.factories import make_request
from worker.engine import EngineRequest
from worker.engine.grammar import CompilingRequests, GrammarError, Grammars, GrammarState

SCHEMA = {"type": "object"}


class ScriptedGrammars(Grammars):
    """Compiles nothing: each grammar source gets a future the test resolves."""

    def __init__(self) -> None:
        super().__init__(tokenizer=None, vocab_size=10, stop_token_ids=[0])
        self.futures: dict[str, Future[Any]] = {}
        self.followed: list[list[int]] = []

    def compile(self, params: SamplingParams) -> Future[Any]:
        return self.futures.setdefault(str(params.guided_json or params.guided_regex), Future())

    def follow(self, compiled: Any, output_token_ids: Iterable[int] = ()) -> GrammarState:
        self.followed.append(list(output_token_ids))
        return GrammarState(compiled)

    def finish(self, source: object, result: Any = "compiled") -> None:
        future = self.futures[str(source)]
        if not future.cancelled():  # given up: no request waited for it any more
            future.set_result(result)


def guided(request_id: str, **kwargs: Any) -> EngineRequest:
    return make_request([1, 2, 3], request_id, guided_json=SCHEMA, **kwargs)


@pytest.fixture
def grammars() -> ScriptedGrammars:
    return ScriptedGrammars()


def test_a_request_waits_until_its_grammar_compiles(grammars: ScriptedGrammars) -> None:
    compiling = CompilingRequests(grammars)
    req = guided("a")
    assert compiling.add(req) is False
    assert compiling.take(0.0) == ([], []) and "a" in compiling
    grammars.finish(SCHEMA)
    assert compiling.take(0.0) == ([req], [])
    assert req.grammar is not None and req.grammar.matcher == "compiled"
    assert len(compiling) == 0


def test_a_cached_grammar_joins_at_once(grammars: ScriptedGrammars) -> None:
    compiling = CompilingRequests(grammars)
    grammars.compile(guided("first").sampling)
    grammars.finish(SCHEMA)
    req = guided("second")
    assert compiling.add(req) is True
    assert req.grammar is not None and len(compiling) == 0


def test_a_resumed_request_replays_its_tokens_into_the_matcher(
    grammars: ScriptedGrammars,
) -> None:
    compiling = CompilingRequests(grammars)
    compiling.add(guided("resumed", output_token_ids=[7, 8]))
    grammars.finish(SCHEMA)
    compiling.take(0.0)
    assert grammars.followed == [[7, 8]]


def test_a_grammar_that_fails_to_compile_ends_its_request_with_the_error(
    grammars: ScriptedGrammars,
) -> None:
    compiling = CompilingRequests(grammars)
    compiling.add(make_request([1, 2], "bad", guided_regex="(?<=a)b", output_token_ids=[5]))
    grammars.futures["(?<=a)b"].set_exception(GrammarError("guided_regex: lookbehind"))
    ready, ended = compiling.take(0.0)
    assert ready == [] and len(compiling) == 0
    [out] = ended
    assert (out.request_id, out.finish_reason, out.error) == (
        "bad",
        FinishReason.ERROR,
        "guided_regex: lookbehind",
    )
    assert (out.num_prompt_tokens, out.num_output_tokens) == (2, 1)


def test_a_grammar_known_not_to_compile_is_refused_at_once(grammars: ScriptedGrammars) -> None:
    compiling = CompilingRequests(grammars)
    grammars.compile(guided("first").sampling).set_exception(GrammarError("guided_json: no"))
    with pytest.raises(GrammarError, match="guided_json: no"):
        compiling.add(guided("second"))


def test_an_aborted_request_ends_and_does_not_join_later(grammars: ScriptedGrammars) -> None:
    compiling = CompilingRequests(grammars)
    compiling.add(guided("a"))
    assert compiling.abort("a", FinishReason.CANCELLED) is True
    assert compiling.abort("elsewhere", FinishReason.CANCELLED) is False
    grammars.finish(SCHEMA)
    ready, ended = compiling.take(0.0)
    assert ready == [] and [(o.request_id, o.finish_reason) for o in ended] == [
        ("a", FinishReason.CANCELLED)
    ]
    assert compiling.take(0.0) == ([], [])


def test_a_request_past_its_deadline_stops_waiting(grammars: ScriptedGrammars) -> None:
    compiling = CompilingRequests(grammars)
    compiling.add(guided("late", deadline_unix_s=100.0))
    compiling.add(guided("on-time", deadline_unix_s=300.0))
    _, ended = compiling.take(200.0)
    assert [(o.request_id, o.finish_reason) for o in ended] == [("late", FinishReason.TIMEOUT)]
    assert "on-time" in compiling


def test_wait_returns_once_a_compile_finishes(grammars: ScriptedGrammars) -> None:
    compiling = CompilingRequests(grammars)
    compiling.wait(60.0)  # nothing compiling: returns at once
    compiling.add(guided("a"))
    grammars.finish(SCHEMA)
    compiling.wait(60.0)
    assert [r.request_id for r in compiling.take(0.0)[0]] == ["a"]


def test_grammars_compile_once_per_schema_and_say_why_one_fails(tokenizer: Any) -> None:
    real = Grammars(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id])
    first = real.compile(SamplingParams(guided_json={"type": "object", "required": ["a"]}))
    again = real.compile(SamplingParams(guided_json={"required": ["a"], "type": "object"}))
    assert again is first
    state = real.follow(first.result(timeout=60))
    assert state.accept(tokenizer.encode("{")[0])
    bad = real.compile(SamplingParams(guided_regex="(?<=a)b"))
    with pytest.raises(GrammarError, match=r"guided_regex: .*Lookbehind is not supported"):
        bad.result(timeout=60)


def test_properties_come_in_the_order_the_schema_declares(tokenizer: Any) -> None:
    real = Grammars(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id])
    properties = {"name": {"type": "string"}, "country": {"type": "string"}}
    schema = {"type": "object", "properties": properties, "required": ["name", "country"]}
    compiled = real.compile(SamplingParams(guided_json=schema)).result(timeout=60)

    def takes(text: str) -> bool:
        state = real.follow(compiled)
        return all(state.accept(t) for t in tokenizer.encode(text))

    assert takes('{"name": "Paris", "country": "France"}')
    assert not takes('{"country": "France"')  # not sorted by name
    tag = {"type": "structural_tag", "format": {"type": "json_schema", "json_schema": schema}}
    tagged = real.compile(SamplingParams(guided_structural_tag=tag)).result(timeout=60)
    assert real.follow(tagged).accept(tokenizer.encode("{")[0])
