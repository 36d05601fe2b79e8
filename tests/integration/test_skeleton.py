"""The walking skeleton end to end: a real redis-server (and a real Redis Cluster), a
real worker process on the default model, requests over all four priorities from
producer.Client."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer.client import Client, Handle
from shared.models import FinalEvent, FinishReason, RequestState, StreamEvent, TokenEvent
from shared.settings import DEFAULT_MODEL, Settings
from tests.conftest import serve
from tests.integration.conftest import TokenqRedis, WorkerFactory
from tests.reference import greedy_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = [
    ("critical", "What is the capital of France?", True),
    ("low", "Name three colours.", True),
    ("high", "Write a haiku about Redis.", True),
    ("normal", "Once upon a time", False),
    ("critical", "Count from one to five.", True),
    ("low", "The quick brown fox", False),
    ("high", "Why is the sky blue?", True),
    ("normal", "Give me a synonym for happy.", True),
]
MAX_TOKENS = 24


def _submit(client: Client, priority: str, text: str, chat: bool) -> Handle:
    body = {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
    return client.submit(**body, priority=priority, max_tokens=MAX_TOKENS, temperature=0)


def test_requests_over_all_priorities_stream_back_exactly_what_generate_gives(
    any_real_redis: TokenqRedis, start_worker: WorkerFactory, default_model_dir: Path
) -> None:
    connection = any_real_redis.connection
    serve(connection, DEFAULT_MODEL)  # as a worker that served it before would have
    client = Client(connection=connection, settings=Settings())
    handles = [_submit(client, p, text, chat) for p, text, chat in PROMPTS]
    never = client.submit("this one is cancelled before it runs", priority="critical")
    assert never.cancel() == "cancelled"

    worker = start_worker("--redis", any_real_redis.url, "--max-num-seqs", "2", "--burst")
    first = handles[0]
    live = list(first.stream(timeout=300))  # as it generates; the rest once all have ended
    assert worker.wait(timeout=300) == 0, "the worker failed; see its log in the test's tmp dir"
    events = {h.id: list(h.stream()) for h in handles}
    assert [e.id for e in live] == [e.id for e in events[first.id]]

    references = greedy_reference(default_model_dir, [(t, c) for _, t, c in PROMPTS], MAX_TOKENS)
    for handle, reference in zip(handles, references, strict=True):
        _check_stream(events[handle.id], reference)
        _check_result(handle, reference)
    _check_priority_order(handles)
    _check_never_ran(never)


def _check_stream(events: list[StreamEvent], reference: list[int]) -> None:
    tokens = [e.event for e in events if isinstance(e.event, TokenEvent)]
    indexes = [t.index for t in tokens]
    sizes = [len(t.token_ids) for t in tokens]
    assert indexes == [sum(sizes[:i]) for i in range(len(sizes))], (
        "token indexes must be contiguous"
    )
    assert [tid for t in tokens for tid in t.token_ids] == reference
    assert isinstance(events[-1].event, FinalEvent)


def _check_result(handle: Handle, reference: list[int]) -> None:
    result = handle.result(timeout=5)
    assert list(result.token_ids) == reference
    assert result.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert result.usage.completion_tokens == len(reference) and result.usage.prompt_tokens > 0
    t = result.timings
    assert t.queued_s is not None and t.ttft_s is not None and t.total_s is not None
    assert 0 <= t.queued_s <= t.ttft_s <= t.total_s


def _check_priority_order(handles: list[Handle]) -> None:
    started = {h.id: h.status().started_ms or 0 for h in handles}
    by_priority = sorted(handles, key=lambda h: -h.status().priority)
    firsts = [started[h.id] for h in by_priority]
    # With two batch slots the two critical requests are claimed first and the two
    # low ones last.
    assert max(firsts[:2]) <= min(firsts[-2:])


def _check_never_ran(handle: Handle) -> None:
    status = handle.status()
    assert (status.state, status.attempts, status.worker) == (RequestState.CANCELLED, 0, None)
    assert [type(e.event) for e in handle.stream()] == [FinalEvent]
