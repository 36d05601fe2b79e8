"""A background response's stream resumed from another gateway after its worker was
killed mid-answer: every event exactly once, in order, and the greedy text of an
uninterrupted run (real gateway and worker processes, a real redis-server)."""

from __future__ import annotations

import signal
import time
from typing import Any

import openai
import pytest
import redis

from producer.embedded import EmbeddedRedis
from shared.keys import Keys
from shared.settings import DEFAULT_MODEL
from tests.integration.conftest import FAULT_ENV, WorkerFactory
from tests.integration.faults import wait_until
from tests.integration.openai_stack import WORKER_ARGS
from tests.producer.gateway.process import gateway_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ASK = "Count from one to one hundred in words."
NUM_TOKENS = 96


def num_serving(connection: redis.Redis) -> int:
    """Workers that have loaded the model (they register, loading, before they do)."""
    ids: Any = connection.zrange(Keys().workers(), 0, -1)
    states = [connection.hget(Keys().worker(i.decode()), "state") for i in ids]
    return states.count(b"serving")


def test_a_stream_resumes_on_another_gateway_after_its_worker_died(
    redis_server: EmbeddedRedis, start_worker: WorkerFactory
) -> None:
    connection = redis.Redis.from_url(redis_server.url)
    connection.flushall()
    workers = [start_worker(*WORKER_ARGS, env=FAULT_ENV) for _ in range(2)]
    with (
        gateway_process(redis_server.url, **FAULT_ENV) as first_url,
        gateway_process(redis_server.url, **FAULT_ENV) as second_url,
        openai.OpenAI(base_url=f"{first_url}/v1", api_key="none", max_retries=0) as first,
        openai.OpenAI(base_url=f"{second_url}/v1", api_key="none", max_retries=0) as second,
    ):
        wait_until(lambda: num_serving(connection) == 2, 300, "two workers to serve")
        greedy: dict[str, Any] = {"model": DEFAULT_MODEL, "temperature": 0}
        long = {"ignore_eos": True}  # runs to max_output_tokens
        stream = first.responses.create(
            input=ASK, background=True, stream=True, max_output_tokens=NUM_TOKENS,
            extra_body=long, **greedy,
        )  # fmt: skip
        seen: list[Any] = []
        for event in stream:
            seen.append(event)
            if sum(e.type == "response.output_text.delta" for e in seen) == 5:
                break
        stream.close()
        response_id: str = seen[0].response.id
        request_id = response_id.removeprefix("resp_")
        holder = connection.hget(Keys().request(request_id), "worker")
        (victim,) = [w for w in workers if holder and f"-{w.pid}-".encode() in holder]
        victim.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        rest = list(
            second.responses.retrieve(
                response_id, stream=True, starting_after=seen[-1].sequence_number
            )
        )
        assert time.monotonic() - killed_at > 1.0  # it waited for the other worker
        whole = [e.model_dump() for e in first.responses.retrieve(response_id, stream=True)]
        uninterrupted = second.chat.completions.create(
            messages=[{"role": "user", "content": ASK}],
            max_tokens=NUM_TOKENS,
            extra_body=long,
            **greedy,
        )
    assert [e.model_dump() for e in seen + rest] == whole
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    assert whole[-1]["type"] == "response.incomplete"
    text = "".join(e["delta"] for e in whole if e["type"] == "response.output_text.delta")
    assert text == uninterrupted.choices[0].message.content
    assert whole[-1]["response"]["usage"]["output_tokens"] == NUM_TOKENS
    connection.close()
