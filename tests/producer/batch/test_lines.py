"""Batch input lines: OpenAI's batch format and plain bodies, with clear errors."""

from __future__ import annotations

import json

import pytest

from producer.batch.bodies import parse_jsonl
from producer.batch.lines import BatchInputError, BatchLine, LineError
from producer.batch.output import refused_line, result_line
from producer.openai.reasoning import ReasoningPlan
from producer.streams.entries import parse_entry
from shared.chat import ChatFeatures
from shared.models import (
    FinishReason,
    GenerationRequest,
    Result,
    Timings,
    TokenEvent,
    Usage,
    dumps,
)
from shared.settings import Settings
from tests.producer.batch.conftest import jsonl

SETTINGS = Settings()
ADD: dict[str, object] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": ADD}}


def request_of(line: BatchLine) -> GenerationRequest:
    assert line.error is None and line.request is not None, line.error
    return line.request


def error_of(line: BatchLine) -> LineError:
    assert line.request is None and line.error is not None
    return line.error


def chat_line(custom_id: str = "a", /, **body: object) -> str:
    messages = [{"role": "user", "content": "hi"}]
    return json.dumps({"custom_id": custom_id, "body": {"messages": messages, **body}})


def test_openai_chat_and_completion_lines_become_requests() -> None:
    text = jsonl(1) + jsonl(1, url="/v1/completions").replace("line-0", "line-c")
    chat, completion = parse_jsonl(text, SETTINGS)
    assert (chat.custom_id, chat.kind, chat.n, chat.tools) == ("line-0", "chat", 1, None)
    messages = request_of(chat).messages
    assert messages is not None and messages[0].content == "hello 0"
    assert request_of(chat).sampling.max_tokens == 3
    assert (completion.kind, request_of(completion).prompt) == ("completion", "p 0")


def test_a_plain_body_line_and_the_default_model() -> None:
    text = '{"custom_id": "a", "prompt": "hi", "max_tokens": 5, "stop": "x"}\n\n'
    (line,) = parse_jsonl(text, SETTINGS, model="other")
    request = request_of(line)
    assert (line.kind, request.model, request.prompt) == ("completion", "other", "hi")
    assert (request.sampling.max_tokens, request.sampling.stop) == (5, ("x",))
    (default,) = parse_jsonl('{"custom_id": "b", "prompt": "hi"}', SETTINGS)
    assert request_of(default).model == SETTINGS.default_model


def test_developer_role_and_content_parts_are_accepted() -> None:
    msg = '{"role": "developer", "content": [{"type": "text", "text": "be brief"}]}'
    text = f'{{"custom_id": "a", "body": {{"messages": [{msg}]}}}}'
    (line,) = parse_jsonl(text, SETTINGS)
    messages = request_of(line).messages
    assert messages is not None
    assert (messages[0].role, messages[0].content) == ("system", "be brief")


def test_lines_that_cannot_be_told_apart_refuse_the_file_by_number() -> None:
    text = "\n".join(
        [
            '{"custom_id": "a", "prompt": "ok"}',
            "not json",
            '{"custom_id": "a", "prompt": "again"}',
            '{"custom_id": "b", "url": "/v1/audio/speech", "body": {"input": "x"}}',
            '{"prompt": "no id"}',
            '{"custom_id": "c", "body": {}}',
        ]
    )
    with pytest.raises(BatchInputError) as err:
        parse_jsonl(text, SETTINGS)
    message = str(err.value)
    assert "5 bad line(s)" in message
    assert "line 2: not JSON" in message
    assert "line 3: custom_id 'a' is used twice" in message
    assert "line 4: url: '/v1/audio/speech' is not supported" in message
    assert "line 5: custom_id: give a non-empty string" in message
    assert "line 6: body: give messages, prompt or input" in message


def test_a_bad_body_keeps_its_line_with_the_routes_400_and_the_others_run() -> None:
    text = "\n".join(
        [
            chat_line("ok"),
            chat_line("hot", temperature=-1),
            chat_line("odd", tools=[{"type": "function", "function": {"name": "f"}}], x=1),
            chat_line("many", n=17),
            '{"custom_id": "echo", "body": {"prompt": "x", "echo": true}}',
        ]
    )
    ok, hot, odd, many, echo = parse_jsonl(text, SETTINGS)
    assert request_of(ok).messages is not None
    assert error_of(hot).status == 400
    assert error_of(hot).param == "temperature"
    assert "temperature: Input should be greater than or equal to 0" in error_of(hot).message
    assert error_of(odd).message == "invalid request: x: unknown field 'x'"
    assert error_of(many).message == "n: must be from 1 to 16 (got 17)"
    assert (error_of(echo).param, error_of(echo).code) == ("echo", "unsupported")
    assert BatchLine.from_json(hot.to_json()) == hot


@pytest.mark.parametrize(
    ("field", "says"),
    [
        ({"priority": "high"}, "priority: a batch line runs at the batch's priority"),
        ({"priority": 0}, "priority: a batch line runs at the batch's priority"),
        ({"idempotency_key": "k"}, "idempotency_key: a batch line's requests are keyed"),
        ({"stream": True}, "stream: a batch line's answer goes to the output file"),
    ],
)
def test_fields_of_live_calls_only_are_refused_by_name(field: dict[str, object], says: str) -> None:
    (line,) = parse_jsonl(chat_line(**field), SETTINGS)
    assert error_of(line).message.startswith(says)
    assert error_of(line).param == next(iter(field))
    (quiet,) = parse_jsonl(chat_line(stream=False), SETTINGS)
    assert request_of(quiet).messages is not None


def test_a_tools_line_keeps_its_plan_and_is_constrained_to_the_named_function() -> None:
    choice = {"type": "function", "function": {"name": "add"}}
    (line,) = parse_jsonl(chat_line(tools=[ADD_TOOL], tool_choice=choice), SETTINGS)
    plan = line.tools
    assert plan is not None and (plan.mode, plan.named) == ("named", "add")
    request = request_of(line)
    assert {"guided_json": request.sampling.guided_json} == plan.guide()
    messages = request.messages
    assert messages is not None and messages[0].role == "system"
    assert "You must call the tool add now." in messages[0].content
    assert BatchLine.from_json(line.to_json()) == line


def test_an_n_line_keeps_n_and_tool_choice_none_keeps_no_plan() -> None:
    (line,) = parse_jsonl(chat_line(n=3, seed=7, tools=[ADD_TOOL], tool_choice="none"), SETTINGS)
    assert (line.n, line.tools, request_of(line).sampling.seed) == (3, None, 7)
    assert BatchLine.from_json(line.to_json()) == line


def test_structured_output_penalties_and_bias_ride_on_batch_lines() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        "presence_penalty": 0.5,
        "frequency_penalty": 1.0,
        "logit_bias": {"42": -100},
    }
    (line,) = parse_jsonl(json.dumps({"custom_id": "a", "body": body}), SETTINGS)
    s = request_of(line).sampling
    a = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
    assert s.guided_json == {**schema, "properties": {"a": a}, "additionalProperties": False}
    assert (s.presence_penalty, s.frequency_penalty, s.logit_bias) == (0.5, 1.0, {42: -100.0})
    assert BatchLine.from_json(line.to_json()) == line


def test_an_empty_file_and_too_many_lines_are_refused() -> None:
    with pytest.raises(BatchInputError, match="no lines"):
        parse_jsonl("\n \n", SETTINGS)
    with pytest.raises(BatchInputError, match="3 lines, over the limit of 2"):
        parse_jsonl(jsonl(3), SETTINGS, max_lines=2)


@pytest.mark.parametrize(
    ("field", "param", "says"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty", "presence_penalty"),
        ({"logit_bias": {"7": 300}}, "logit_bias.7", "logit_bias.7"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "response_format.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"if": {}}}}},
            "response_format.json_schema.schema",
            "'if'",
        ),
        ({"tool_choice": "required"}, "tool_choice", "'required' needs tools"),
    ],
)
def test_bad_structured_penalty_or_tool_fields_name_the_field(
    field: dict[str, object], param: str, says: str
) -> None:
    (line,) = parse_jsonl(chat_line(**field), SETTINGS)
    assert error_of(line).param == param
    assert says in error_of(line).message


def test_an_embeddings_line_embeds_one_text() -> None:
    body = {"model": "m", "input": ["a text"], "dimensions": 8}
    text = json.dumps({"custom_id": "e", "url": "/v1/embeddings", "body": body})
    (line,) = parse_jsonl(text, SETTINGS)
    request = request_of(line)
    assert (line.kind, request.task, request.prompt) == ("embedding", "embed", "a text")
    assert request.dimensions == 8
    plain = parse_jsonl('{"custom_id": "f", "input": "plain"}', SETTINGS)[0]
    assert (plain.kind, request_of(plain).task) == ("embedding", "embed")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": ["one", "two"]}, "input: give one text per batch line"),
        ({"input": "x", "encoding_format": "base64"}, "only 'float' is supported in a batch"),
        ({"input": "x", "temperature": 1}, "unsupported field(s) temperature"),
    ],
)
def test_bad_embeddings_lines_are_refused(body: dict[str, object], message: str) -> None:
    text = json.dumps({"custom_id": "e", "url": "/v1/embeddings", "body": body})
    (line,) = parse_jsonl(text, SETTINGS)
    assert message in error_of(line).message


def result(request_id: str, text: str, num_tokens: int, reason: str = "stop") -> Result:
    return Result(
        id=request_id,
        model="m",
        text=text,
        token_ids=tuple(range(num_tokens)),
        finish_reason=FinishReason(reason),
        usage=Usage(prompt_tokens=4, completion_tokens=num_tokens),
        timings=Timings(),
    )


def test_an_embedding_result_becomes_an_openai_embeddings_body() -> None:
    embedded = result("r1", "", 0).model_copy(update={"embedding": (0.6, 0.8)})
    ok, line = result_line(BatchLine("e", "embedding", None), [embedded])
    body = json.loads(line)["response"]["body"]
    assert ok
    assert body["data"] == [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}]
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}


def test_a_tools_lines_output_carries_tool_calls_as_the_live_route_renders_them() -> None:
    (line,) = parse_jsonl(chat_line(tools=[ADD_TOOL], tool_choice="required"), SETTINGS)
    reply = '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}'
    ok, out = result_line(line, [result("r1", reply, 9)])
    choice = json.loads(out)["response"]["body"]["choices"][0]
    assert ok and choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert (call["id"], call["type"], call["function"]["name"]) == (
        "call_r1_0_0",
        "function",
        "add",
    )
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
    assert choice["message"]["content"] is None


def test_an_n_lines_output_has_its_choices_and_summed_usage() -> None:
    (line,) = parse_jsonl(chat_line(n=2), SETTINGS)
    ok, out = result_line(line, [result("r1", "one", 3), result("r2", "two", 5, "length")])
    response = json.loads(out)["response"]
    body = response["body"]
    assert ok and response["request_id"] == "r1,r2"
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "one", "stop"),
        (1, "two", "length"),
    ]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 8, "total_tokens": 12}
    failed, error = result_line(line, [result("r1", "one", 3), result("r2", "", 0, "cancelled")])
    assert not failed and json.loads(error)["error"]["code"] == "cancelled"


def test_a_refused_lines_error_line_carries_the_routes_answer() -> None:
    (line,) = parse_jsonl(chat_line("hot", temperature=-1), SETTINGS)
    out = json.loads(refused_line(line))
    assert out["custom_id"] == "hot" and out["response"]["status_code"] == 400
    error = out["response"]["body"]["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "temperature")
    assert out["error"] == {"code": error["code"], "message": error["message"]}


def test_a_logprobs_lines_output_carries_its_streams_logprobs() -> None:
    (line,) = parse_jsonl(chat_line(logprobs=True, top_logprobs=1), SETTINGS)
    assert line.logprobs and request_of(line).sampling.logprobs == 1
    top = {"token_id": 7, "logprob": -0.25, "top": [{"token_id": 7, "logprob": -0.25}]}
    event = TokenEvent(index=0, token_ids=(7,), text="hi", logprobs=(top,))
    stream = [parse_entry("1-0", {b"e": dumps(event)})]
    ok, out = result_line(line, [result("r1", "hi", 1)], [stream])
    (entry,) = json.loads(out)["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert ok and (entry["token"], entry["logprob"]) == ("hi", -0.25)
    assert entry["top_logprobs"] == [{"token": "hi", "logprob": -0.25, "bytes": [104, 105]}]


QWEN3 = ChatFeatures(tool_format="hermes", think=("<think>", "</think>"))


def test_a_line_for_a_model_that_takes_tools_and_thinks_is_read_in_its_format() -> None:
    text = chat_line(tools=[ADD_TOOL], tool_choice="required")
    (line,) = parse_jsonl(text, SETTINGS, features=lambda model: QWEN3)
    request = request_of(line)
    assert request.tools is not None and [t.name for t in request.tools] == ["add"]
    assert request.sampling.guided_structural_tag is not None
    assert [m.role for m in request.messages or ()] == ["user"]  # no fallback prompt
    assert line.tools is not None and line.tools.format == "hermes"
    assert line.reasoning == ReasoningPlan("<think>", "</think>")
    assert BatchLine.from_json(line.to_json()) == line  # as the store keeps it
    reply = ["<think>", "add them", "</think>", "\n\n", '<tool_call>\n{"name": "add", ']
    reply.append('"arguments": {"a": 1, "b": 2}}\n</tool_call>')
    events = [TokenEvent(index=i, token_ids=(i,), text=t) for i, t in enumerate(reply)]
    stream = [parse_entry(f"{i}-0", {b"e": dumps(e)}) for i, e in enumerate(events)]
    ok, out = result_line(line, [result("r1", "".join(reply), len(reply))], [stream])
    body = json.loads(out)["response"]["body"]
    message = body["choices"][0]["message"]
    assert ok and message["reasoning_content"] == "add them" and message["content"] is None
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
