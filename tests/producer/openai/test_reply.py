"""Tool calls and reasoning read from replies as models write them, whole and streamed
in pieces of every size: the pieces add up to the whole reply's reading."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from producer.openai.reasoning import ReasoningPlan
from producer.openai.reply import Delta, ReplyReader
from producer.openai.tool_formats import Format
from producer.openai.tools import ToolPlan, plan_tools

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("get_weather", "get_time")
]
THINK = ReasoningPlan("<think>", "</think>")
PARIS = {"city": "Paris", "unit": "celsius"}
TOKYO = {"city": "Tokyo"}

# Replies as the models write them (their tool-call formats; special tokens such as
# Mistral's [TOOL_CALLS] and Llama's <|python_tag|> are left out of text deltas).
QWEN3_THINKING = (
    "<think>\nThe user wants the weather in Paris. I should call get_weather.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "</tool_call>"
)
QWEN25_PARALLEL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Tokyo"}}\n</tool_call>'
)
HERMES_WITH_PREAMBLE = (
    "Let me check that for you.\n"
    '<tool_call>\n{"name": "get_time", "arguments": {"city": "Tokyo"}}\n</tool_call>'
)
LLAMA31 = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'
LLAMA32_TWO = (
    '{"type": "function", "name": "get_weather", "parameters": {"city": "Paris", '
    '"unit": "celsius"}}; {"name": "get_time", "parameters": {"city": "Tokyo"}}'
)
MISTRAL = (
    ' [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
    '{"name": "get_time", "arguments": {"city": "Tokyo"}}]'
)
MISTRAL_MARKED = '[TOOL_CALLS] [{"name": "get_time", "arguments": {"city": "Tokyo"}}]'
FALLBACK = '{"tool_calls": [{"name": "get_time", "arguments": {"city": "Tokyo"}}]}'

CASES: list[tuple[Format, str, str | None, list[tuple[str, dict[str, Any]]]]] = [
    ("hermes", QWEN25_PARALLEL, None, [("get_weather", PARIS), ("get_time", TOKYO)]),
    ("hermes", HERMES_WITH_PREAMBLE, "Let me check that for you.\n", [("get_time", TOKYO)]),
    ("llama3_json", LLAMA31, None, [("get_weather", PARIS)]),
    ("llama3_json", LLAMA32_TWO, None, [("get_weather", PARIS), ("get_time", TOKYO)]),
    ("mistral", MISTRAL, None, [("get_weather", PARIS), ("get_time", TOKYO)]),
    ("mistral", MISTRAL_MARKED, None, [("get_time", TOKYO)]),
    ("json", FALLBACK, None, [("get_time", TOKYO)]),
]


def _plan(fmt: Format, choice: object = "auto") -> ToolPlan:
    return plan_tools(TOOLS, choice, None, fmt)


def _read(
    text: str, tools: ToolPlan | None, think: ReasoningPlan | None, size: int, cut: bool = False
) -> tuple[Delta, list[Delta]]:
    """The reply fed ``size`` characters at a time (0: whole): all it said, and each feed's."""
    reader = ReplyReader(tools, think, "r_0")
    pieces = [text] if size == 0 else [text[i : i + size] for i in range(0, len(text), size)]
    deltas = [reader.feed(piece) for piece in pieces] + [reader.finish(cut)]
    total = Delta()
    for delta in deltas:
        total += delta
    return total, deltas


def _calls(delta: Delta) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], orjson.loads(c["function"]["arguments"])) for c in delta.calls]


@pytest.mark.parametrize("size", [0, 1, 3, 7])
@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_each_format_yields_its_calls_whole_and_streamed(
    fmt: Format, text: str, content: str | None, calls: list[Any], size: int
) -> None:
    total, _ = _read(text, _plan(fmt), None, size)
    assert _calls(total) == calls
    assert total.content == (content or "")
    ids = [c["id"] for c in total.calls]
    if fmt == "mistral":  # its template takes back 9 letters and digits only
        assert all(len(i) == 9 and i.isalnum() for i in ids) and len(set(ids)) == len(ids)
    else:
        assert ids == [f"call_r_0_{i}" for i in range(len(calls))]


@pytest.mark.parametrize("size", [0, 1, 5])
def test_reasoning_comes_apart_from_the_answer_and_its_calls(size: int) -> None:
    total, deltas = _read(QWEN3_THINKING, _plan("hermes"), THINK, size)
    assert total.reasoning == "\nThe user wants the weather in Paris. I should call get_weather.\n"
    assert total.content == ""
    assert _calls(total) == [("get_weather", PARIS)]
    if size:  # streamed: no piece of a tag is ever sent as text
        sent = "".join(d.reasoning + d.content for d in deltas)
        assert "<" not in sent and ">" not in sent


@pytest.mark.parametrize("size", [0, 1, 4])
def test_a_reply_that_opens_no_think_block_is_all_answer(size: int) -> None:
    total, _ = _read("  <thinly veiled> answer", None, THINK, size)
    assert (total.reasoning, total.content) == ("", "  <thinly veiled> answer")


@pytest.mark.parametrize("size", [0, 2])
def test_a_prompt_that_opened_the_block_makes_the_reply_start_in_reasoning(size: int) -> None:
    opened = ReasoningPlan("<think>", "</think>", opened=True)
    total, _ = _read("plan it</think>\n\nDone.", None, opened, size)
    assert (total.reasoning, total.content) == ("plan it", "Done.")
    cut, _ = _read("still thinking", None, opened, size, cut=True)
    assert (cut.reasoning, cut.content) == ("still thinking", "")


@pytest.mark.parametrize("size", [0, 1, 6])
@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("hermes", QWEN25_PARALLEL.replace("Tokyo", "Tok")[:-30]),
        ("mistral", MISTRAL[:-20]),
        ("json", '{"tool_calls": [' + FALLBACK[16:-2] + ', {"name": "get_ti'),
    ],
)
def test_a_reply_cut_short_keeps_its_complete_calls_and_sends_no_json(
    fmt: Format, text: str, size: int
) -> None:
    total, _ = _read(text, _plan(fmt, "required"), None, size, cut=True)
    assert len(total.calls) == 1
    assert total.content == ""


def test_a_cut_reply_with_no_complete_call_sends_nothing_and_a_finished_one_its_text() -> None:
    partial = '<tool_call>\n{"name": "get_weather", "argu'
    cut, _ = _read(partial, _plan("hermes"), None, 0, cut=True)
    assert (cut.content, cut.calls) == ("", [])
    ended, _ = _read(partial, _plan("hermes"), None, 0, cut=False)
    assert (ended.content, ended.calls) == (partial, [])  # not calls after all: its text


@pytest.mark.parametrize("size", [0, 1])
def test_prose_and_calls_of_unknown_functions_are_text(size: int) -> None:
    prose, _ = _read("It is sunny in Paris.", _plan("llama3_json"), None, size)
    assert (prose.content, prose.calls) == ("It is sunny in Paris.", [])
    unknown = '{"name": "launch", "parameters": {}}'
    total, _ = _read(unknown, _plan("llama3_json"), None, size)
    assert (total.content, total.calls) == (unknown, [])


def test_a_hermes_call_streams_as_soon_as_it_closes() -> None:
    reader = ReplyReader(_plan("hermes"), None, "r_0")
    first_end = QWEN25_PARALLEL.index("</tool_call>") + len("</tool_call>")
    assert reader.feed(QWEN25_PARALLEL[: first_end - 1]).calls == []
    assert _calls(reader.feed(QWEN25_PARALLEL[first_end - 1 : first_end])) == [
        ("get_weather", PARIS)
    ]
