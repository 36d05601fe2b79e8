"""``tokenq worker --engine vllm`` through Redis and the gateway, against vLLM's own
``LLM.generate`` (tests/integration/vllm_stack.py: one worker for the whole run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import redis

from producer.client import Client, Handle
from producer.embedded import EmbeddedRedis
from shared.keys import Keys
from shared.models import FinalEvent, FinishReason, RequestState, TokenEvent
from shared.settings import DEFAULT_MODEL, get_settings
from tests.integration.vllm_stack import (
    MAX_NUM_SEQS,
    REPO,
    VLLM_ENV,
    VllmStack,
    start_stack,
    vllm_bin,
    vllm_reference,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKLOAD = REPO / "bench" / "workloads" / "mixed200.jsonl"  # the whole mixed workload
RESULT_TIMEOUT_S = 600.0


def _workload() -> list[dict[str, Any]]:
    lines = WORKLOAD.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _greedy_case(line: dict[str, Any]) -> dict[str, Any]:
    """A workload line as vLLM's sampling fields (logprobs of the chosen token)."""
    return {
        "messages": line["messages"],
        "max_tokens": line["max_tokens"],
        "ignore_eos": line["ignore_eos"],
        "temperature": 0.0,
        "logprobs": 0,
    }


STORY = [{"role": "user", "content": "Write a short story about the ocean."}]
# A stop string its greedy answer holds (the reference checks that it stops there).
STOP_CASE: dict[str, Any] = {
    "messages": STORY,
    "max_tokens": 64,
    "temperature": 0.0,
    "stop": [" of"],
}


@pytest.fixture(scope="session")
def vllm_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmStack]:
    yield from start_stack(tmp_path_factory.mktemp("vllm"))


@pytest.fixture(scope="session")
def reference(
    tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path
) -> list[dict[str, Any]]:
    """vLLM's own answers: the workload's, then the stop case's."""
    cases = [*(_greedy_case(line) for line in _workload()), STOP_CASE]
    return vllm_reference(default_model_dir, cases, tmp_path_factory.mktemp("vllm-ref"))


@pytest.fixture
def client(vllm_stack: VllmStack) -> Iterator[Client]:
    with Client(vllm_stack.redis_url) as c:
        yield c


def _streamed(handle: Handle) -> tuple[list[int], str, list[float], FinalEvent]:
    """Its stream read whole: the tokens, text and chosen logprobs, and the final event;
    each token event starts where the one before ended."""
    token_ids: list[int] = []
    texts: list[str] = []
    logprobs: list[float] = []
    for entry in handle.stream(timeout=RESULT_TIMEOUT_S):
        event = entry.event
        if isinstance(event, TokenEvent):
            assert event.index == len(token_ids)  # no gap, no duplicate
            token_ids += event.token_ids
            texts.append(event.text)
            logprobs += [lp["logprob"] for lp in event.logprobs or ()]
        elif isinstance(event, FinalEvent):
            return token_ids, "".join(texts), logprobs, event
    pytest.fail(f"the stream of {handle.id} ended without a final event")


# Structured outputs and prompt logprobs, against vLLM's own (``feature_reference``, in
# this order).
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
JSON_CASE: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Describe a person as JSON."}],
    "max_tokens": 100,
    "temperature": 0.0,
}
ANSWER = r"(yes|no), because [a-z ]{5,30}\."
REGEX_CASE: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Is the sea blue?"}],
    "max_tokens": 40,
    "temperature": 0.0,
}
SCORED = "The capital of France is Paris. The capital of Italy is Rome."
SCORED_CASE: dict[str, Any] = {
    "prompt": SCORED,
    "max_tokens": 4,
    "temperature": 0.0,
    "prompt_logprobs": 2,
}


@pytest.fixture(scope="session")
def feature_reference(
    tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path
) -> list[dict[str, Any]]:
    """vLLM's own answers: JSON_CASE under PERSON, REGEX_CASE under ANSWER, SCORED_CASE
    with its prompt logprobs."""
    cases = [
        {**JSON_CASE, "structured_outputs": {"json": PERSON}},
        {**REGEX_CASE, "structured_outputs": {"regex": ANSWER}},
        SCORED_CASE,
    ]
    return vllm_reference(default_model_dir, cases, tmp_path_factory.mktemp("vllm-features"))


def test_greedy_tokens_through_redis_equal_vllm_generate(
    reference: list[dict[str, Any]], vllm_stack: VllmStack, client: Client
) -> None:
    lines = _workload()
    assert len(lines) == 200  # the whole mixed workload, as issue 46 asks
    handles = [
        client.submit(model=DEFAULT_MODEL, **_greedy_case(line), priority=line["priority"])
        for line in lines
    ]
    for at, handle in enumerate(handles):
        expected = reference[at]
        result = handle.result(timeout=RESULT_TIMEOUT_S)
        assert result.error is None, result.error
        assert list(result.token_ids) == expected["token_ids"], f"request {at}"
        assert result.text == expected["text"], f"request {at}"
        assert result.finish_reason.value == expected["finish_reason"]
        assert result.usage.prompt_tokens == len(expected["prompt_token_ids"])
        assert result.usage.completion_tokens == len(expected["token_ids"])
        token_ids, text, logprobs, final = _streamed(handle)
        assert (token_ids, text) == (list(result.token_ids), result.text)
        assert final.finish_reason == result.finish_reason
        assert logprobs == pytest.approx(expected["logprobs"], abs=1e-4), f"request {at}"
    assert vllm_stack.alive()


def test_stop_strings_end_as_vllm_ends_them(
    client: Client, reference: list[dict[str, Any]]
) -> None:
    expected = reference[-1]
    assert expected["finish_reason"] == "stop"  # the stop string is in the greedy answer
    handle = client.submit(model=DEFAULT_MODEL, **STOP_CASE)
    result = handle.result(timeout=RESULT_TIMEOUT_S)
    assert (result.text, result.finish_reason.value) == (expected["text"], "stop")
    assert " of" not in result.text


def test_the_same_seed_samples_the_same_text(client: Client) -> None:
    def sampled(seed: int) -> str:
        handle = client.submit(
            model=DEFAULT_MODEL, messages=STORY, max_tokens=24, temperature=1.0, seed=seed
        )
        return handle.result(timeout=RESULT_TIMEOUT_S).text

    first = sampled(1234)
    assert sampled(1234) == first
    assert first not in {sampled(99), sampled(7)}  # the seed is what keeps it


def test_n_2_gives_two_choices_through_the_gateway(vllm_stack: VllmStack) -> None:
    body = {
        "model": DEFAULT_MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 12,
        "n": 2,
        "temperature": 1.0,
        "ignore_eos": True,  # sampled: an end-of-sequence token must not cut a choice short
    }
    reply = httpx.post(f"{vllm_stack.gateway_url}/v1/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    choices = reply.json()["choices"]
    assert sorted(c["index"] for c in choices) == [0, 1]
    assert all(c["text"] and c["finish_reason"] == "length" for c in choices)
    assert reply.json()["usage"]["completion_tokens"] == 24


def test_cancel_while_running_and_while_queued(client: Client) -> None:
    long: dict[str, Any] = {
        "model": DEFAULT_MODEL,
        "prompt": "Count:",
        "max_tokens": 1500,
        "ignore_eos": True,
    }
    running = [client.submit(**long) for _ in range(MAX_NUM_SEQS + 4)]
    queued = client.submit(**long, priority="low")
    _wait_for(lambda: running[0].status().num_generated > 0, "a first token")
    assert queued.status().state is RequestState.QUEUED
    assert queued.cancel() == "cancelled"
    assert queued.result(timeout=60).finish_reason.value == "cancelled"
    for handle in running:
        handle.cancel()
    for handle in running:
        result = handle.result(timeout=RESULT_TIMEOUT_S)
        assert result.finish_reason.value == "cancelled"
        assert len(result.token_ids) < 1500


def test_a_deadline_ends_a_request_with_timeout(client: Client) -> None:
    handle = client.submit(
        model=DEFAULT_MODEL, prompt="Count:", max_tokens=1500, ignore_eos=True, deadline=3.0
    )
    result = handle.result(timeout=RESULT_TIMEOUT_S)
    assert result.finish_reason.value == "timeout"
    assert len(result.token_ids) < 1500


def test_a_critical_request_behind_many_low_ones_starts_first(client: Client) -> None:
    low = [
        client.submit(model=DEFAULT_MODEL, prompt=f"Item {i}:", max_tokens=8, priority="low")
        for i in range(200)
    ]
    critical = client.submit(
        model=DEFAULT_MODEL, prompt="Urgent:", max_tokens=8, priority="critical"
    )
    critical.result(timeout=RESULT_TIMEOUT_S)
    started = critical.status().first_token_ms
    assert started is not None
    for handle in low:
        handle.result(timeout=RESULT_TIMEOUT_S)
    before = [h for h in low if (h.status().first_token_ms or 0) < started]
    # Only those already claimed when it came (vLLM's batch and the look-ahead) start before.
    assert len(before) <= 2 * MAX_NUM_SEQS, len(before)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"logit_bias": {"999999": 5}}, "logit_bias"),
        ({"max_tokens": 100000}, "max_tokens"),
        ({"prompt": "word " * 5000}, "prompt"),
        ({"temperature": -1}, "temperature"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids"),
        ({"top_p": 0}, "top_p"),
        ({"guided_regex": "(unclosed"}, "guided_regex"),  # vLLM's grammar compiler refuses it
    ],
)
def test_hostile_requests_get_a_4xx_naming_the_field_and_the_worker_lives(
    vllm_stack: VllmStack, body: dict[str, Any], field: str
) -> None:
    request = {"model": DEFAULT_MODEL, "prompt": "Hello", "max_tokens": 4, **body}
    reply = httpx.post(f"{vllm_stack.gateway_url}/v1/completions", json=request, timeout=300)
    assert 400 <= reply.status_code < 500, reply.text
    assert field in reply.text
    fine = httpx.post(
        f"{vllm_stack.gateway_url}/v1/completions",
        json={"model": DEFAULT_MODEL, "prompt": "Hello", "max_tokens": 4},
        timeout=300,
    )
    assert fine.status_code == 200, fine.text
    assert vllm_stack.alive()


def test_embeddings_are_refused_at_submit_by_name(vllm_stack: VllmStack) -> None:
    body = {"model": DEFAULT_MODEL, "input": "Hello"}
    reply = httpx.post(f"{vllm_stack.gateway_url}/v1/embeddings", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "task"
    assert "computes embeddings" in error["message"] and "--runner pooling" in error["message"]
    assert vllm_stack.alive()


def test_an_embed_request_that_reaches_it_is_refused_and_it_serves_on(client: Client) -> None:
    # A client that read the model's limits before this worker registered them (the
    # cache keeps them LIMITS_CACHE_S): its embed request reaches the worker.
    client._limits.ttl_s = 3600.0
    client._limits._keep(DEFAULT_MODEL, None)
    (handle,) = client.submit_many([{"model": DEFAULT_MODEL, "prompt": "Hello", "task": "embed"}])
    result = handle.result(RESULT_TIMEOUT_S)
    assert result.embedding is None and result.refusal is not None
    assert result.refusal.param == "task"
    assert "computes no embeddings" in result.refusal.message
    after = client.submit("Hello", max_tokens=4, temperature=0.0).result(RESULT_TIMEOUT_S)
    assert after.finish_reason is FinishReason.LENGTH and len(after.token_ids) == 4


def test_json_object_through_the_gateway_is_a_json_object(vllm_stack: VllmStack) -> None:
    body = {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "Describe a person as JSON."}],
        "max_tokens": 200,
        "temperature": 0.0,
        "response_format": {"type": "json_object"},
    }
    reply = httpx.post(f"{vllm_stack.gateway_url}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_a_schema_structured_outputs_cannot_enforce_is_refused_at_submit(
    vllm_stack: VllmStack,
) -> None:
    schema = {"type": "object", "not": {"required": ["a"]}}  # xgrammar ignores "not"
    body = {"model": DEFAULT_MODEL, "prompt": "Hello", "max_tokens": 8, "guided_json": schema}
    reply = httpx.post(f"{vllm_stack.gateway_url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "guided_json" and "'not'" in reply.text


def test_the_registry_shows_vllms_figures(vllm_stack: VllmStack, client: Client) -> None:
    long_prompt = "Summarise: " + "the sea and the sky " * 100  # blocks are 128 tokens on CPUs
    for _ in range(2):  # the second finds the first's prompt in vLLM's prefix cache
        client.submit(model=DEFAULT_MODEL, prompt=long_prompt, max_tokens=4).result(timeout=300)
    keys = Keys(get_settings().namespace)
    with redis.Redis.from_url(vllm_stack.redis_url, decode_responses=True) as connection:
        (worker_id,) = connection.zrange(keys.workers(), 0, -1)

        def entry() -> dict[str, str]:
            fields: dict[str, str] = connection.hgetall(keys.worker(worker_id))
            return fields

        _wait_for(lambda: float(entry().get("prefix_cache_hit_rate", 0)) > 0, "prefix hit", 60)
        shown = entry()
    assert shown["model"] == DEFAULT_MODEL and shown["device"] == "cpu"
    assert int(shown["max_num_seqs"]) == MAX_NUM_SEQS and int(shown["kv_cache_mib"]) > 0
    assert {"running", "waiting", "kv_cache_usage", "preemptions"} <= set(shown)


def test_an_unknown_engine_argument_is_refused_by_name_at_start_up() -> None:
    tokenq = vllm_bin("tokenq")
    done = subprocess.run(
        [str(tokenq), "worker", "--engine", "vllm", "--vllm-arg", "no_such_argument=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2
    assert "vLLM has no engine argument no_such_argument" in done.stdout.decode()


def _wait_for(check: Any, what: str, timeout_s: float = RESULT_TIMEOUT_S) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if check():
            return
        time.sleep(0.1)
    pytest.fail(f"no {what} in {timeout_s:.0f}s")


TP2 = ("--enforce-eager", "--tensor-parallel-size", "2")


def test_tensor_parallel_size_reaches_vllm(tmp_path: Path) -> None:
    # Two shards cannot run here: the default model's 9 attention heads do not split in
    # two (nor would two ranks fit beside the worker on two cores). What is tested is
    # that the flag reaches vLLM's own check, which names it.
    server = EmbeddedRedis().start()
    try:
        done = subprocess.run(
            [str(vllm_bin("tokenq")), "worker", "--engine", "vllm", "--redis", server.url, *TP2],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=600,
            check=False,
            env={**os.environ, **VLLM_ENV},
        )
    finally:
        server.stop()
    assert done.returncode == 1
    assert "must be divisible by tensor parallel size (2)" in done.stdout.decode()


def _as_vllms(handle: Handle, expected: dict[str, Any]) -> str:
    """Its text, once its tokens, text and stream are vLLM's own ``expected``."""
    result = handle.result(timeout=RESULT_TIMEOUT_S)
    assert result.error is None, result.error
    assert list(result.token_ids) == expected["token_ids"]
    assert result.text == expected["text"]
    assert _streamed(handle)[:2] == (list(result.token_ids), result.text)
    return result.text


def test_a_json_schema_request_gives_json_valid_against_it_as_vllms_own(
    client: Client, feature_reference: list[dict[str, Any]]
) -> None:
    handle = client.submit(model=DEFAULT_MODEL, **JSON_CASE, guided_json=PERSON)
    text = _as_vllms(handle, feature_reference[0])
    jsonschema.validate(json.loads(text), PERSON)


def test_a_regex_request_matches_it_as_vllms_own(
    client: Client, feature_reference: list[dict[str, Any]]
) -> None:
    handle = client.submit(model=DEFAULT_MODEL, **REGEX_CASE, guided_regex=ANSWER)
    assert re.fullmatch(ANSWER, _as_vllms(handle, feature_reference[1]))


def test_prompt_logprobs_are_vllms_own_in_tokenqs_entries(
    client: Client, feature_reference: list[dict[str, Any]]
) -> None:
    expected = feature_reference[2]
    handle = client.submit(model=DEFAULT_MODEL, **SCORED_CASE)
    _as_vllms(handle, expected)
    entries = handle.result(timeout=RESULT_TIMEOUT_S).prompt_logprobs
    assert entries is not None
    assert [e["token_id"] for e in entries] == expected["prompt_token_ids"]
    assert entries[0]["logprob"] is None
    chosen = [e["logprob"] for e in entries[1:]]
    assert chosen == pytest.approx(expected["prompt_logprobs"][1:], abs=1e-4)
    for entry in entries[1:]:
        assert entry["rank"] >= 1 and len(entry["top"]) == 2 and entry["token"]
        tops = [t["logprob"] for t in entry["top"]]
        assert tops == sorted(tops, reverse=True) and tops[0] >= entry["logprob"] - 1e-6


def test_echo_with_logprobs_and_no_tokens_scores_the_prompt(
    vllm_stack: VllmStack, feature_reference: list[dict[str, Any]]
) -> None:
    expected = feature_reference[2]["prompt_logprobs"]
    body = {"model": DEFAULT_MODEL, "prompt": SCORED, "echo": True, "logprobs": 1, "max_tokens": 0}
    reply = httpx.post(f"{vllm_stack.gateway_url}/v1/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["text"] == SCORED and choice["finish_reason"] == "length"
    assert reply.json()["usage"]["completion_tokens"] == 0
    token_logprobs = choice["logprobs"]["token_logprobs"]
    assert token_logprobs[0] is None and len(token_logprobs) == len(expected)
    assert token_logprobs[1:] == pytest.approx(expected[1:], abs=1e-4)
