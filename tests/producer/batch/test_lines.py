"""Batch input lines: OpenAI's batch format and plain bodies, with clear errors."""

from __future__ import annotations

import json
import re

import pytest

from producer.batch.lines import BatchInputError, BatchLine, parse_jsonl
from producer.batch.output import result_line
from shared.models import FinishReason, Result, Timings, Usage
from shared.settings import Settings
from tests.producer.batch.conftest import jsonl

SETTINGS = Settings()


def test_openai_chat_and_completion_lines_become_requests() -> None:
    text = jsonl(1) + jsonl(1, url="/v1/completions").replace("line-0", "line-c")
    chat, completion = parse_jsonl(text, SETTINGS)
    assert (chat.custom_id, chat.kind) == ("line-0", "chat")
    assert chat.request.messages is not None
    assert chat.request.messages[0].content == "hello 0"
    assert chat.request.sampling.max_tokens == 3
    assert (completion.kind, completion.request.prompt) == ("completion", "p 0")


def test_a_plain_body_line_and_the_default_model() -> None:
    text = '{"custom_id": "a", "prompt": "hi", "max_completion_tokens": 5, "stop": "x"}\n\n'
    (line,) = parse_jsonl(text, SETTINGS, model="other")
    assert (line.kind, line.request.model, line.request.prompt) == ("completion", "other", "hi")
    assert (line.request.sampling.max_tokens, line.request.sampling.stop) == (5, ("x",))


def test_developer_role_and_content_parts_are_accepted() -> None:
    msg = '{"role": "developer", "content": [{"type": "text", "text": "be brief"}]}'
    text = f'{{"custom_id": "a", "body": {{"messages": [{msg}]}}}}'
    (line,) = parse_jsonl(text, SETTINGS)
    assert line.request.messages is not None
    assert (line.request.messages[0].role, line.request.messages[0].content) == (
        "system",
        "be brief",
    )


def test_every_bad_line_is_reported_with_its_number() -> None:
    text = "\n".join(
        [
            '{"custom_id": "a", "prompt": "ok"}',
            "not json",
            '{"custom_id": "a", "prompt": "again"}',
            '{"custom_id": "b", "url": "/v1/audio/speech", "body": {"input": "x"}}',
            '{"custom_id": "c", "body": {"prompt": "x", "n": 2}}',
            '{"prompt": "no id"}',
            '{"custom_id": "d", "body": {"prompt": "x", "tools": []}}',
        ]
    )
    with pytest.raises(BatchInputError) as err:
        parse_jsonl(text, SETTINGS)
    message = str(err.value)
    assert "6 bad line(s)" in message
    assert "line 2: not JSON" in message
    assert "line 3: custom_id 'a' is used twice" in message
    assert "line 4: url: '/v1/audio/speech' is not supported" in message
    assert "line 5: body.n: only 1 is supported" in message
    assert "line 6: custom_id: give a non-empty string" in message
    assert "line 7: body: unsupported field(s) tools" in message


def test_invalid_sampling_names_the_field() -> None:
    with pytest.raises(BatchInputError, match=r"line 1: .*sampling.temperature"):
        parse_jsonl('{"custom_id": "a", "prompt": "x", "temperature": -1}', SETTINGS)


def test_an_empty_file_and_too_many_lines_are_refused() -> None:
    with pytest.raises(BatchInputError, match="no lines"):
        parse_jsonl("\n \n", SETTINGS)
    with pytest.raises(BatchInputError, match="3 lines, over the limit of 2"):
        parse_jsonl(jsonl(3), SETTINGS, max_lines=2)


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
    s = line.request.sampling
    assert s.guided_json == schema
    assert (s.presence_penalty, s.frequency_penalty, s.logit_bias) == (0.5, 1.0, {42: -100.0})
    assert BatchLine.from_json(line.to_json()) == line


@pytest.mark.parametrize(
    ("field", "says"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"logit_bias": {"7": 300}}, "logit_bias.7"),
        ({"response_format": {"type": "xml"}}, "body.response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"if": {}}}}},
            "'if'",
        ),
    ],
)
def test_bad_structured_or_penalty_fields_name_the_line(
    field: dict[str, object], says: str
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **field}
    with pytest.raises(BatchInputError, match="line 1") as caught:
        parse_jsonl(json.dumps({"custom_id": "a", "body": body}), SETTINGS)
    assert says in str(caught.value)


def test_an_embeddings_line_embeds_one_text() -> None:
    body = {"model": "m", "input": ["a text"], "dimensions": 8}
    text = json.dumps({"custom_id": "e", "url": "/v1/embeddings", "body": body})
    (line,) = parse_jsonl(text, SETTINGS)
    assert (line.kind, line.request.task, line.request.prompt) == ("embedding", "embed", "a text")
    assert line.request.dimensions == 8
    plain = parse_jsonl('{"custom_id": "f", "input": "plain"}', SETTINGS)[0]
    assert (plain.kind, plain.request.task) == ("embedding", "embed")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": ["one", "two"]}, "body.input: give one text per batch line"),
        ({"input": "x", "encoding_format": "base64"}, "only 'float' is supported in a batch"),
        ({"input": "x", "temperature": 1}, "unsupported field(s) temperature"),
    ],
)
def test_bad_embeddings_lines_are_refused(body: dict[str, object], message: str) -> None:
    line = json.dumps({"custom_id": "e", "url": "/v1/embeddings", "body": body})
    with pytest.raises(BatchInputError, match=re.escape(message)):
        parse_jsonl(line, SETTINGS)


def test_an_embedding_result_becomes_an_openai_embeddings_body() -> None:
    result = Result(
        id="r1",
        model="m",
        text="",
        token_ids=(),
        finish_reason=FinishReason.STOP,
        usage=Usage(prompt_tokens=4),
        timings=Timings(),
        embedding=(0.6, 0.8),
    )
    ok, line = result_line("e", "embedding", result)
    body = json.loads(line)["response"]["body"]
    assert ok
    assert body["data"] == [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}]
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
