"""Stream events rendered the OpenAI way; the hand-built chunks match the documented models."""

from __future__ import annotations

import orjson

from producer.openai.output import Renderer, chat_completion, failure, stream_end
from producer.openai.output import completion as whole_completion
from producer.openai.responses import ChatCompletionChunk, Completion
from producer.openai.tools import plan_tools
from producer.streams.entries import Entry, parse_entry
from shared.models import FinalEvent, FinishReason, TokenEvent, Usage, dumps

FINAL = FinalEvent(
    finish_reason=FinishReason.LENGTH, usage=Usage(prompt_tokens=2, completion_tokens=2)
)


def _token(i: int, logprobs: bool = False, text: str | None = None) -> Entry:
    lp = ({"token_id": i, "logprob": -0.1, "top": [{"token_id": 9, "logprob": -2.0}]},)
    event = TokenEvent(
        index=i,
        token_ids=(i,),
        text=f"w{i}" if text is None else text,
        logprobs=lp if logprobs else None,
    )
    return parse_entry(f"{i}-0", {"e": dumps(event)})


def _payloads(frames: bytes) -> list[str]:
    return [line.removeprefix(b"data: ").decode() for line in frames.split(b"\n\n") if line]


def test_chat_chunks_validate_and_end_with_usage_then_done() -> None:
    r = Renderer("chat", "abc", "m", include_usage=True)
    final = parse_entry("9-0", {"e": dumps(FINAL)})
    rendered, seen_final = r.render([_token(0, True), final])
    assert seen_final == FINAL
    frames = r.first_chunk() + rendered + stream_end([r], [FINAL])
    payloads = _payloads(frames)
    assert payloads[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(p) for p in payloads[:-1]]
    assert [c.id for c in chunks] == ["chatcmpl-abc"] * 4
    assert chunks[1].choices[0].logprobs is not None
    assert chunks[1].choices[0].logprobs.content is not None
    top = chunks[1].choices[0].logprobs.content[0].top_logprobs[0]
    assert (top.token, top.logprob) == ("token_id:9", -2.0)
    assert chunks[2].choices[0].finish_reason == "length"
    assert chunks[3].usage is not None and chunks[3].usage.total_tokens == 4


def test_text_chunks_carry_offsets_and_the_whole_completion_agrees() -> None:
    streamed = Renderer("text", "abc", "m")
    frames = streamed.token_chunk(_token(0, True)) + streamed.token_chunk(_token(1, True))
    chunks = [Completion.model_validate_json(p) for p in _payloads(frames)]
    offsets = [c.choices[0].logprobs.text_offset for c in chunks if c.choices[0].logprobs]
    assert offsets == [[0], [2]]
    whole = Renderer("text", "abc", "m")
    whole.add(_token(0, True))
    whole.add(_token(1, True))
    completion = whole_completion([whole], [FINAL], want_logprobs=True)
    assert completion.choices[0].text == "w0w1"
    assert completion.choices[0].logprobs is not None
    assert completion.choices[0].logprobs.tokens == ["w0", "w1"]
    assert completion.choices[0].logprobs.text_offset == [0, 2]


def test_an_error_final_in_a_stream_sends_an_error_object_before_done() -> None:
    r = Renderer("chat", "abc", "m")
    broken = FinalEvent(finish_reason=FinishReason.ERROR, error="CUDA fell over")
    payloads = _payloads(r.final_chunks(broken) + stream_end([r], [broken]))
    assert orjson.loads(payloads[1])["error"]["code"] == "generation_failed"
    assert payloads[-1] == "[DONE]"


def test_expired_and_failed_requests_are_errors_not_answers() -> None:
    expired = failure(FinalEvent(finish_reason=FinishReason.EXPIRED, error="late"))
    failed = failure(FinalEvent(finish_reason=FinishReason.ERROR, error="boom"))
    assert expired is not None and expired.status == 504
    assert failed is not None and failed.status == 500
    assert failure(FINAL) is None
    assert failure(FinalEvent(finish_reason=FinishReason.CANCELLED)) is None


WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = ['{"tool_calls": [{"name": "weather", ', '"arguments": {"city": "Oslo"}}]}']
STOP = FinalEvent(
    finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=5, completion_tokens=2)
)


def test_a_streamed_tool_call_comes_as_one_tool_calls_delta_once_complete() -> None:
    r = Renderer("chat", "abc", "m", tools=plan_tools(WEATHER, "auto"))
    assert r.token_chunk(_token(0, text=CALL[0])) == b""  # it may be a call: held
    frames = r.token_chunk(_token(1, text=CALL[1])) + r.final_chunks(STOP)
    chunks = [ChatCompletionChunk.model_validate_json(p) for p in _payloads(frames)]
    calls = chunks[0].choices[0].delta.tool_calls
    assert calls is not None and [c.index for c in calls] == [0]
    assert (calls[0].function.name, calls[0].function.arguments) == ("weather", '{"city":"Oslo"}')
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_an_auto_reply_in_prose_streams_as_content() -> None:
    r = Renderer("chat", "abc", "m", tools=plan_tools(WEATHER, "auto"))
    frames = r.token_chunk(_token(0, text="It is")) + r.final_chunks(STOP)
    chunks = [ChatCompletionChunk.model_validate_json(p) for p in _payloads(frames)]
    assert chunks[0].choices[0].delta.content == "It is"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_choices_make_one_completion_with_indexes_and_summed_usage() -> None:
    named = plan_tools(WEATHER, {"type": "function", "function": {"name": "weather"}})
    renderers = [Renderer("chat", "abc", "m", index=i, tools=named) for i in range(2)]
    renderers[0].add(_token(0, text="".join(CALL)))
    renderers[1].add(_token(0, text="not a call"))
    reply = chat_completion(renderers, [STOP, STOP], want_logprobs=False)
    assert [c.index for c in reply.choices] == [0, 1]
    first, second = reply.choices
    assert first.message.tool_calls is not None and first.message.content is None
    assert first.message.tool_calls[0].id == "call_abc_0_0"
    assert first.finish_reason == "stop"  # as OpenAI answers a named tool_choice
    assert second.message.content == "not a call" and second.message.tool_calls is None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (5, 4)


def test_logprobs_carry_the_names_and_bytes_the_worker_gave_each_token() -> None:
    """Each token and alternative by its text decoded alone; a part of a character by
    its own bytes (the worker names both: this side has no tokenizer)."""
    entry = {
        "token_id": 5, "logprob": -0.5, "token": " \ufffd", "bytes": [32, 240, 159],
        "top": [{"token_id": 5, "logprob": -0.5, "token": " \ufffd", "bytes": [32, 240, 159]},
                {"token_id": 9, "logprob": -1.5, "token": " café"}],
    }  # fmt: skip
    event = TokenEvent(index=0, token_ids=(5,), text="", logprobs=(entry,))
    r = Renderer("chat", "abc", "m")
    r.add(parse_entry("0-0", {"e": dumps(event)}))
    (reply,) = chat_completion([r], [STOP], want_logprobs=True).choices
    assert reply.logprobs is not None and reply.logprobs.content is not None
    (token,) = reply.logprobs.content
    assert (token.token, token.bytes) == (" \ufffd", [32, 240, 159])
    named = [(t.token, t.bytes) for t in token.top_logprobs]
    assert named == [(" \ufffd", [32, 240, 159]), (" café", list(" café".encode()))]


def test_logprobs_of_tokens_with_no_text_still_come_in_the_stream() -> None:
    r = Renderer("chat", "abc", "m")
    frames = r.token_chunk(_token(0, True, text="")) + r.final_chunks(STOP)
    chunks = [ChatCompletionChunk.model_validate_json(p) for p in _payloads(frames)]
    sent = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert len(sent) == 1 and sent[0].content is not None and len(sent[0].content) == 1


def test_a_refusal_in_a_stream_is_an_invalid_request_error_naming_the_field() -> None:
    r = Renderer("chat", "abc", "m")
    refused = FinalEvent(
        finish_reason=FinishReason.ERROR,
        error="cannot run this request: request abc: 9000 prompt tokens and max_tokens 4 "
        "need 9004 tokens of context, over the 8192 that the model takes",
    )
    payloads = _payloads(r.final_chunks(refused) + stream_end([r], [refused]))
    error = orjson.loads(payloads[1])["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "messages")
    assert error["code"] == "context_length_exceeded"
