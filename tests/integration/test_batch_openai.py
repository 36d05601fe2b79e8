"""Batch lines with tools and n, and embeddings lines, through the real batch path (RQ
worker processes, a real redis-server, a worker on the default model) answer what the
live route answers for the same body."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import openai
import orjson
import pytest

from producer.batch.ops import Batches
from producer.client import Client
from producer.embedded import EmbeddedRedis
from shared.settings import DEFAULT_MODEL, Settings
from tests.integration.openai_tools import ADD, TOOLS
from tests.producer.batch.procs import RqWorkers, rq_batch_settings, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ADD_CHOICE = {"type": "function", "function": {"name": "add"}}
BODIES: dict[str, dict[str, Any]] = {
    "tools": {
        "messages": [{"role": "user", "content": "What is 2 plus 3?"}],
        "tools": TOOLS,
        "tool_choice": ADD_CHOICE,
        "max_tokens": 60,
        "temperature": 0,
    },
    "n2": {
        "messages": [{"role": "user", "content": "Name a colour."}],
        "n": 2,
        "max_tokens": 8,
        "temperature": 0,
    },
    "bad": {"messages": [{"role": "user", "content": "hi"}], "temperature": -1},
}
TEXT = "The tide comes in twice a day."
EMBED = {"input": TEXT}
RESPONSE: dict[str, Any] = {"input": "Name a colour.", "max_output_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def live(openai_client: openai.OpenAI) -> openai.OpenAI:
    return openai_client


def run_batch(url: str, log_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The batch of BODIES run by an RQ worker process: outputs and errors by custom_id."""
    workers = RqWorkers(url, log_dir)
    batches = Batches(Client(settings=Settings(redis_url=url)), rq_batch_settings())
    try:
        workers.start("--no-scheduler")
        lines = [
            {"custom_id": custom_id, "url": "/v1/chat/completions", "body": body}
            for custom_id, body in BODIES.items()
        ]
        lines.append({"custom_id": "embed", "url": "/v1/embeddings", "body": EMBED})
        lines.append({"custom_id": "response", "url": "/v1/responses", "body": RESPONSE})
        batch_id = batches.submit(lines, model=DEFAULT_MODEL)
        wait_for(lambda: batches.status(batch_id).state.terminal, 180, "the batch to end")
        outputs, errors = batches.results(batch_id)
    finally:
        workers.stop_all()
        batches.ctx.redis.close()
    return by_custom_id(outputs), by_custom_id(errors)


def by_custom_id(lines: list[bytes]) -> dict[str, Any]:
    parsed = [orjson.loads(line) for line in lines]
    return {line["custom_id"]: line for line in parsed}


def answered_live(client: openai.OpenAI, custom_id: str) -> dict[str, Any]:
    raw = client.chat.completions.with_raw_response.create(model=DEFAULT_MODEL, **BODIES[custom_id])
    body: dict[str, Any] = raw.http_response.json()
    return body


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """The answer without what differs between any two calls: ids and the time."""
    choices = []
    for choice in body["choices"]:
        message = dict(choice["message"])
        if "tool_calls" in message:
            assert all(c["id"].startswith("call_") for c in message["tool_calls"])
            message["tool_calls"] = [{**c, "id": None} for c in message["tool_calls"]]
        choices.append({**choice, "message": message})
    return {**body, "id": None, "created": None, "choices": choices}


def test_tools_and_n_lines_answer_as_the_live_route_and_a_bad_line_as_its_400(
    live: openai.OpenAI, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    outputs, errors = run_batch(redis_server.url, tmp_path)
    assert (sorted(outputs), sorted(errors)) == (["embed", "n2", "response", "tools"], ["bad"])
    tools = outputs["tools"]["response"]["body"]
    (choice,) = tools["choices"]
    assert choice["finish_reason"] == "stop"  # OpenAI's for a named choice
    (call,) = choice["message"]["tool_calls"]
    assert (call["type"], call["function"]["name"]) == ("function", "add")
    jsonschema.validate(json.loads(call["function"]["arguments"]), ADD)
    assert comparable(tools) == comparable(answered_live(live, "tools"))
    n2 = outputs["n2"]["response"]["body"]
    assert [c["index"] for c in n2["choices"]] == [0, 1]
    assert comparable(n2) == comparable(answered_live(live, "n2"))
    one = live.chat.completions.create(model=DEFAULT_MODEL, **{**BODIES["n2"], "n": 1}).usage
    assert one is not None  # greedy: both choices are this one, and usage sums them
    assert n2["usage"] == {
        "prompt_tokens": one.prompt_tokens,
        "completion_tokens": 2 * one.completion_tokens,
        "total_tokens": one.prompt_tokens + 2 * one.completion_tokens,
    }
    with pytest.raises(openai.BadRequestError) as refused:
        answered_live(live, "bad")
    bad = errors["bad"]
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"] == refused.value.body
    assert bad["error"]["message"] == refused.value.body["message"]  # type: ignore[index]
    embed = outputs["embed"]["response"]["body"]
    (item,) = embed["data"]
    live_vector = live.embeddings.create(model=DEFAULT_MODEL, input=TEXT).data[0].embedding
    batched, alone = np.array(item["embedding"]), np.array(live_vector)
    assert (embed["object"], item["object"], batched.shape) == ("list", "embedding", alone.shape)
    assert float(batched @ alone) / float(np.linalg.norm(batched) * np.linalg.norm(alone)) > 0.9999
    batched_response = outputs["response"]["response"]["body"]
    raw = live.responses.with_raw_response.create(model=DEFAULT_MODEL, store=False, **RESPONSE)
    live_response = raw.http_response.json()
    assert batched_response["output"][0]["content"] == live_response["output"][0]["content"]
    assert batched_response["usage"] == live_response["usage"]
