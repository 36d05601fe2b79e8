"""No request takes a worker down (issue 32), with a real redis-server and real
`tokenq worker` processes on the default model: each hostile input is refused at submit
naming the field, or (written to Redis past the client's checks) ends its own request
with an error naming the field; the worker serves the next request; nothing is
dead-lettered. A worker without its grammar backend serves plain requests and never
claims a structured one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client, Handle
from producer.submit import Submitter, enqueued_flow
from shared.errors import InvalidRequest, MissingCapability
from shared.flows import accepted, drive
from shared.keys import Keys, model_tag
from shared.limits import ModelLimits, registered_limits
from shared.models import FinishReason, GenerationRequest, RequestState
from shared.registry import mark_served
from shared.settings import DEFAULT_MODEL, Settings
from tests.integration.conftest import WorkerFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEYS = Keys()
TAG = model_tag(DEFAULT_MODEL)
ENV = {"TOKENQ_WORKER_HEARTBEAT_MS": "400"}


def serving(connection: redis.Redis, worker: Any, timeout_s: float = 300) -> ModelLimits:
    """The limits the worker registers once it serves (it must not have exited)."""
    give_up = time.monotonic() + timeout_s
    while (limits := registered_limits(connection, DEFAULT_MODEL)) is None:
        assert worker.poll() is None, "the worker exited"
        assert time.monotonic() < give_up, "the worker did not come up"
        time.sleep(0.2)
    return limits


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def by_hand(client: Client, **fields: Any) -> Handle:
    """Submitted past the client's checks against the registered limits, as another
    client (or an older one) could."""
    req = GenerationRequest.model_validate({"model": DEFAULT_MODEL, **fields})
    flow = enqueued_flow(client.keys, client.settings, Submitter(), [req])
    enqueued, _ = drive(client._scripts, flow)
    [request_id] = accepted(enqueued, [req], client.settings)
    return client.handle(request_id)


def plain(client: Client) -> Handle:
    return client.submit("Say hi.", max_tokens=4, temperature=0.0)


@pytest.fixture
def client(real_redis: redis.Redis) -> Client:
    return Client(connection=real_redis, settings=Settings(max_queued=50))


REFUSED_AT_SUBMIT: list[tuple[dict[str, Any], str]] = [
    ({"top_k": 2**64}, "sampling.top_k"),
    ({"stop_token_ids": [10**6], "min_tokens": 1}, "sampling.stop_token_ids"),
    ({"logit_bias": {10**6: 5.0}}, "sampling.logit_bias"),
    ({"temperature": 1e-39}, "temperature"),
    ({"max_tokens": 10**6 - 1}, "sampling.max_tokens"),
    ({"prompt_token_ids": [1] * 9000}, "prompt_token_ids"),
    ({"guided_json": nested(300)}, "nests deeper than 64"),  # past orjson's depth limit
]


def test_the_client_refuses_what_no_worker_would_run_naming_the_field(
    client: Client, real_redis: redis.Redis, start_worker: WorkerFactory
) -> None:
    worker = start_worker(env=ENV)
    serving(real_redis, worker)
    for fields, says in REFUSED_AT_SUBMIT:
        prompt = None if "prompt_token_ids" in fields else "hi"
        with pytest.raises(InvalidRequest, match=says):
            client.submit(prompt, **fields)
    assert plain(client).result(timeout=120).finish_reason is FinishReason.LENGTH
    assert real_redis.zcard(KEYS.queue(TAG)) == 0 and worker.poll() is None


@pytest.mark.parametrize("engine_args", [(), ("--engine-process",)], ids=["one", "engine-process"])
def test_what_gets_past_the_client_ends_its_own_request_naming_the_field(
    client: Client,
    real_redis: redis.Redis,
    start_worker: WorkerFactory,
    engine_args: tuple[str, ...],
) -> None:
    worker = start_worker(*engine_args, env=ENV)
    limits = serving(real_redis, worker)
    vocab, context = limits.vocab_size, limits.max_model_len
    hostile = {
        "stop_token_ids": by_hand(
            client, prompt="hi", sampling={"stop_token_ids": [vocab + 5], "min_tokens": 1}
        ),
        "logit_bias": by_hand(client, prompt="hi", sampling={"logit_bias": {vocab: 3.0}}),
        "max_tokens": by_hand(client, prompt="hi", sampling={"max_tokens": context}),
        "prompt tokens": client.submit("hello " * (context + 10), max_tokens=4),
        "guided_regex": client.submit("hi", guided_regex="(?<=a)b", max_tokens=4),
        "guided_json": client.submit(
            "hi", guided_json={"type": "integer", "minimum": 5, "maximum": 1}, max_tokens=4
        ),
    }
    after = plain(client)
    for field, handle in hostile.items():
        result = handle.result(timeout=120)
        assert result.finish_reason is FinishReason.ERROR, field
        assert result.error is not None and field in result.error, (field, result.error)
        assert handle.status().state is RequestState.FAILED
    assert after.result(timeout=120).finish_reason is FinishReason.LENGTH
    assert worker.poll() is None  # it serves on
    assert real_redis.zcard(KEYS.dead(TAG)) == 0


def test_a_worker_without_its_grammar_backend_serves_plain_requests_and_no_structured_one(
    client: Client, real_redis: redis.Redis, start_worker: WorkerFactory, tmp_path: Path
) -> None:
    shim = tmp_path / "shim" / "xgrammar"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("xgrammar made unimportable")\n')
    worker = start_worker(env={**ENV, "PYTHONPATH": str(shim.parent)})
    limits = serving(real_redis, worker)
    assert limits.guided is False
    with pytest.raises(MissingCapability, match="structured outputs"):
        client.submit("hi", guided_regex="[ab]+")
    # A worker that serves them beat once (and is gone): structured requests queue, and
    # this one never claims them.
    pipe = real_redis.pipeline()
    mark_served(pipe, KEYS, client.settings, DEFAULT_MODEL, guided=True)
    pipe.execute()
    structured = by_hand(client, prompt="hi", sampling={"guided_regex": "[ab]+"})
    served = plain(client)
    assert served.result(timeout=120).finish_reason is FinishReason.LENGTH
    assert structured.status().state is RequestState.QUEUED
    assert worker.poll() is None
    log = (tmp_path / "worker-0.log").read_text()
    lines = [line for line in log.splitlines() if "structured outputs off" in line]
    assert len(lines) == 1 and "xgrammar made unimportable" in lines[0], log
