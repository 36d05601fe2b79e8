"""A model whose chat template takes tools and thinks, end to end: a tiny random-weight
Qwen3-shaped model with Qwen3's chat template, served by a worker process behind a
gateway, called with the unmodified ``openai`` package. Its worker registers the
template's features; the gateway renders tools through the template, forces calls in
the model's own format with the grammar, and reads calls and reasoning back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from producer.embedded import EmbeddedRedis
from tests.integration.openai_stack import openai_stack
from tests.integration.openai_tools import PARAMETERS, TOOLS
from tests.worker.templated import QWEN3_TOKENS, template, templated_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "tiny-qwen3"
ASK: Any = [{"role": "user", "content": "Weather in Paris?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def build_tiny_qwen3(path: Path) -> Path:
    """A random-weight Qwen3-shaped model (seeded) with the default model's tokenizer,
    Qwen3's chat template and its tool and think tokens."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from worker.model_store import resolve_model

    tokenizer = templated_tokenizer(
        str(resolve_model("SmolLM2-135M-Instruct")), template("qwen3"), QWEN3_TOKENS
    )
    config = AutoConfig.for_model(
        "qwen3",
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(0)
    model: Any = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def client(
    redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[openai.OpenAI]:
    model_dir = build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))
    log_dir = tmp_path_factory.mktemp("worker")
    with openai_stack(redis_server.url, log_dir, str(model_dir), MODEL) as c:
        yield c


def chat(c: openai.OpenAI, **fields: Any) -> Any:
    return c.chat.completions.create(model=MODEL, **{"messages": ASK, **fields})


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_the_grammar_forces_a_call_in_the_models_own_format(
    client: openai.OpenAI, choice: Any
) -> None:
    forced: dict[str, Any] = {
        "tools": TOOLS,
        "tool_choice": choice,
        "parallel_tool_calls": False,
        "max_tokens": 120,
        "temperature": 1.0,
        "extra_body": NO_THINKING,
    }
    finish = "tool_calls" if choice == "required" else "stop"
    for seed in range(3):
        reply = chat(client, seed=seed, **forced)
        (call,) = reply.choices[0].message.tool_calls
        assert reply.choices[0].message.content is None
        assert reply.choices[0].finish_reason == finish
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
    chunks = list(chat(client, seed=1, stream=True, **forced))
    (streamed,) = [tool for c in chunks for tool in c.choices[0].delta.tool_calls or ()]
    assert streamed.index == 0 and streamed.function is not None
    arguments = json.loads(streamed.function.arguments or "")
    jsonschema.validate(arguments, PARAMETERS[streamed.function.name or ""])
    assert not any(c.choices[0].delta.content for c in chunks)
    assert chunks[-1].choices[0].finish_reason == finish


def test_tools_and_template_kwargs_reach_the_template(client: openai.OpenAI) -> None:
    plain = chat(client, max_tokens=1).usage.prompt_tokens
    with_tools = chat(client, max_tokens=1, tools=TOOLS).usage.prompt_tokens
    no_thinking = chat(client, max_tokens=1, extra_body=NO_THINKING).usage.prompt_tokens
    assert with_tools > plain + 50  # the <tools> block Qwen3's template writes
    assert no_thinking == plain + 4  # <think> \n\n </think> \n\n: the block closed up front


THOUGHT = {"guided_regex": "<think>[a-z]{2,8}</think>\n\n[a-z]{2,8}"}


def test_reasoning_comes_apart_whole_and_streamed_and_is_counted(client: openai.OpenAI) -> None:
    reply = chat(client, max_tokens=40, temperature=1.0, seed=2, extra_body=THOUGHT)
    message = reply.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning.isalpha() and message.model_extra["reasoning"] == reasoning
    assert message.content.isalpha()
    details = reply.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < reply.usage.completion_tokens
    parts: dict[str, str] = {"reasoning_content": "", "content": ""}
    for chunk in chat(
        client, max_tokens=40, temperature=1.0, seed=2, stream=True, extra_body=THOUGHT
    ):
        delta = chunk.choices[0].delta
        parts["content"] += delta.content or ""
        parts["reasoning_content"] += (delta.model_extra or {}).get("reasoning_content") or ""
    # A random model's near-even logits may tip another way on a prefix-cache hit, so
    # the streamed reply is checked for its shape, not against the whole one.
    assert parts["reasoning_content"].isalpha() and parts["content"].isalpha()
