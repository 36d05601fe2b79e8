"""What a chat template does with tools and reasoning, read from real models' templates,
and prompts rendered through them: tools, tool-call history, chat_template_kwargs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from shared.chat import ChatFeatures
from shared.models import GenerationRequest
from tests.worker.templated import MISTRAL_TOKENS, QWEN3_TOKENS, template, templated_tokenizer
from worker.admission import prompt_token_ids
from worker.chat_template import chat_features
from worker.engine.engine import Engine
from worker.engine.prompt_tokens import encode_text


@pytest.fixture(scope="module")
def source() -> str:
    from worker.model_store import resolve_model

    return str(resolve_model("SmolLM2-135M-Instruct"))


def qwen3(source: str) -> Any:
    return templated_tokenizer(source, template("qwen3"), QWEN3_TOKENS)


def test_each_family_template_says_its_tool_format_and_think_tags(source: str) -> None:
    thinking = template("qwen3").replace(
        "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}"
    )
    found = {
        "qwen3": chat_features(qwen3(source)),
        "qwen3-thinking": chat_features(templated_tokenizer(source, thinking, QWEN3_TOKENS)),
        "llama3": chat_features(templated_tokenizer(source, template("llama3"))),
        "mistral": chat_features(
            templated_tokenizer(source, template("mistral_v03"), special=MISTRAL_TOKENS)
        ),
        "smollm2": chat_features(templated_tokenizer(source, _smollm2_template(source))),
    }
    think = ("<think>", "</think>")
    assert found == {
        "qwen3": ChatFeatures(tool_format="hermes", think=think),
        "qwen3-thinking": ChatFeatures(tool_format="hermes", think=think, think_open=True),
        "llama3": ChatFeatures(tool_format="llama3_json"),
        "mistral": ChatFeatures(tool_format="mistral"),
        "smollm2": ChatFeatures(),  # its template ignores tools: the fallback prompt
    }


def _smollm2_template(source: str) -> str:
    from transformers import AutoTokenizer

    chat_template: str = AutoTokenizer.from_pretrained(source).chat_template
    return chat_template


def _prompt(tokenizer: Any, **fields: Any) -> str:
    request = GenerationRequest.model_validate({"model": "m", **fields})
    # Engine.encode_chat's own body, over a tokenizer alone (no model to load).
    encoder: Any = SimpleNamespace(tokenizer=tokenizer, vocab_size=len(tokenizer))
    encoder.encode_prompt = lambda prompt: Engine.encode_prompt(encoder, prompt)
    encoder.encode_chat = lambda *args: Engine.encode_chat(encoder, *args)
    text: str = tokenizer.decode(prompt_token_ids(encoder, request))
    return text


WEATHER = {"name": "get_weather", "description": "Weather now", "parameters": {"type": "object"}}


def test_tools_and_a_tool_conversation_go_through_the_template(source: str) -> None:
    call = {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    text = _prompt(qwen3(source), messages=messages, tools=[WEATHER])
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    )
    assert "<tool_response>\nsunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_chat_template_kwargs_reach_the_template(source: str) -> None:
    ask = [{"role": "user", "content": "hi"}]
    on = _prompt(qwen3(source), messages=ask)
    off = _prompt(qwen3(source), messages=ask, chat_template_kwargs={"enable_thinking": False})
    assert on.endswith("<|im_start|>assistant\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_token_id_prompts_are_checked_against_the_vocabulary(source: str) -> None:
    tokenizer = qwen3(source)
    ids = tokenizer.encode("Hello there")
    assert _prompt(tokenizer, prompt_token_ids=ids) == "Hello there"
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\] is 999999, outside"):
        _prompt(tokenizer, prompt_token_ids=[ids[0], 999_999])


def test_the_engine_tokenizes_as_transformers_does_added_and_special_tokens_included(
    source: str,
) -> None:
    """The engine renders, then tokenizes through the Rust tokenizer: the same ids as
    transformers' apply_chat_template(tokenize=True) and encode."""
    messages = [
        {"role": "system", "content": "Be brief.  Two  spaces, tabs\t and\nnewlines."},
        {"role": "user", "content": "Use <tool_call> or [TOOL_CALLS] as text; héllo 日本 🙂"},
    ]
    tokenizers = {
        "qwen3": qwen3(source),
        "mistral": templated_tokenizer(source, template("mistral_v03"), special=MISTRAL_TOKENS),
        "smollm2": templated_tokenizer(source, _smollm2_template(source)),
        "llama3": templated_tokenizer(source, template("llama3")),
    }
    tokenizers["llama3"].add_bos_token = True  # encode adds it; a chat prompt must not
    for name, tokenizer in tokenizers.items():
        encoder: Any = SimpleNamespace(tokenizer=tokenizer)
        expected = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        assert Engine.encode_chat(encoder, messages) == list(expected), name
        text = messages[1]["content"]
        assert Engine.encode_prompt(encoder, text) == tokenizer.encode(text), name
        assert encode_text(tokenizer, text, add_special_tokens=False) == tokenizer.encode(
            text, add_special_tokens=False
        ), name
