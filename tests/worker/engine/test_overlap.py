"""Asynchronous scheduling equals the synchronous engine: greedy tokens, text, finish
reasons and usage identical, logprobs within fp32's batch noise; and the timed forward
(a device-like forward on the CPU) is deterministic."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from shared.models import FinishReason, SamplingParams
from tests.worker.engine.conftest import EngineFactory
from tests.worker.engine.factories import make_request
from worker.engine import Engine, EngineRequest, RequestOutput
from worker.engine.overlap import TimedDevice, timed_forward_token_ids

# Batch composition differs by the discarded rows, which moves fp32 sums a little.
LOGPROB_TOLERANCE = 1e-4
PROMPTS = (
    "Describe a cat.",
    "Write a haiku about rain.",
    "List three colours.",
    "What is the capital of France?",
    "Tell me about the moon.",
    "Name a fruit.",
)

Summary = tuple[list[int], str, FinishReason | None, int, list[float]]


def chat(engine: Engine, text: str) -> list[int]:
    return engine.encode_chat([{"role": "user", "content": text}])


def summarize(outputs: list[RequestOutput]) -> Summary:
    final = outputs[-1]
    assert sum(o.finished for o in outputs) == 1 and final.finished
    tokens = [t for o in outputs for t in o.new_token_ids]
    assert final.num_output_tokens == len(tokens)  # a discarded token is never counted
    logprobs = [e["logprob"] for o in outputs for e in o.logprobs or ()]
    return tokens, "".join(o.text for o in outputs), final.finish_reason, len(tokens), logprobs


def requests(engine: Engine, sampling: list[SamplingParams], tag: str) -> list[EngineRequest]:
    return [
        make_request(chat(engine, PROMPTS[i % len(PROMPTS)]), f"{tag}{i}", sampling=params)
        for i, params in enumerate(sampling)
    ]


def both(
    make_engine: EngineFactory,
    sampling: list[SamplingParams],
    setup: Callable[[Engine], None] | None = None,
    **config: Any,
) -> tuple[list[Summary], list[Summary]]:
    """The synchronous engine's summaries, then the asynchronous one's; ``setup`` is
    given each engine before it runs."""
    runs = []
    for async_scheduling in (False, True):
        engine = make_engine(async_scheduling=async_scheduling, **config)
        if setup is not None:
            setup(engine)
        reqs = requests(engine, sampling, "a" if async_scheduling else "s")
        results = engine.generate(reqs)
        runs.append([summarize(results[r.request_id]) for r in reqs])
    return runs[0], runs[1]


def assert_same(sync: list[Summary], overlapped: list[Summary]) -> None:
    for i, (a, b) in enumerate(zip(sync, overlapped, strict=True)):
        assert a[:4] == b[:4], f"request {i}"
        worst = max((abs(x - y) for x, y in zip(a[4], b[4], strict=True)), default=0.0)
        assert worst <= LOGPROB_TOLERANCE, f"request {i}: logprobs differ by {worst:.2e}"


def greedy(**fields: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, **{"max_tokens": 12, **fields})


def mixed_features() -> list[SamplingParams]:
    """A row of each feature that asynchronous steps must keep exact."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    return [
        greedy(logprobs=2, ignore_eos=True),
        greedy(stop=(" the",), max_tokens=20),
        greedy(guided_json=schema, max_tokens=16),
        greedy(repetition_penalty=1.3, frequency_penalty=0.5, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=10, logprobs=0),
        greedy(min_tokens=4, max_tokens=6, stop_token_ids=(13,)),
        greedy(max_tokens=1),
        greedy(max_tokens=7, presence_penalty=0.7),
    ]


@pytest.mark.timeout(900)
def test_mixed_features_equal_the_synchronous_engine(make_engine: EngineFactory) -> None:
    sync, overlapped = both(make_engine, mixed_features())
    assert_same(sync, overlapped)
    assert any(s[2] is FinishReason.STOP for s in sync)  # something stopped early


@pytest.mark.timeout(900)
def test_preemption_under_a_small_kv_budget_equals_the_synchronous_engine(
    make_engine: EngineFactory,
) -> None:
    sampling = [greedy(max_tokens=40, ignore_eos=True, logprobs=0) for _ in range(6)]
    sync, overlapped = both(make_engine, sampling, kv_cache_mib=10)
    assert make_engine(kv_cache_mib=10, async_scheduling=True).scheduler.num_preemptions > 0
    assert_same(sync, overlapped)


@pytest.mark.cuda
@pytest.mark.timeout(900)
def test_on_cuda_asynchronous_steps_equal_the_synchronous_engine(
    make_engine: EngineFactory,
) -> None:
    """On CUDA the sampled ids stay on the device and feed the next step, which is queued
    behind the one running: the same features, fp32, graphs replayed in both. Each
    replay first holds the stream ~1 ms, so the host is well ahead of the device when it
    queues the next step (as with a large model), and the asynchronous engine must have
    fed pending ids on the device."""
    sampling = mixed_features() + [greedy(max_tokens=24 + i, logprobs=0) for i in range(9)]
    fed: dict[bool, list[int]] = {}

    def behind_the_host(engine: Engine) -> None:
        runner, graphs = engine.runner, engine.runner.graphs
        assert graphs is not None, "graphs captured"
        fed[bool(engine.config.async_scheduling)] = count_pending_feeds(runner)
        replay = graphs.run

        def slow_replay(inputs: Any, pending: Any = None) -> torch.Tensor:
            torch.cuda._sleep(2_000_000)  # type: ignore[no-untyped-call]
            return replay(inputs, pending)

        graphs.run = slow_replay  # type: ignore[method-assign]

    sync, overlapped = both(
        make_engine, sampling, behind_the_host, device="cuda", dtype="float32", kv_cache_mib=512
    )
    assert_same(sync, overlapped)
    assert any(s[2] is FinishReason.STOP for s in sync)
    assert fed[False] == [0] and fed[True][0] > 20  # steps that took ids from the device


def count_pending_feeds(runner: Any) -> list[int]:
    """Counts, in the list returned, the steps whose pending tokens came from the step
    before's ids on the device."""
    fed = [0]
    pending = runner._pending

    def counting(inputs: Any, prev_ids: Any) -> Any:
        found = pending(inputs, prev_ids)
        fed[0] += found is not None
        return found

    runner._pending = counting
    return fed


def test_cancel_mid_run_publishes_what_the_synchronous_engine_does(
    make_engine: EngineFactory,
) -> None:
    """Cancelled after its fifth token: the final event follows it, with usage 5."""
    counts = []
    for async_scheduling in (False, True):
        engine = make_engine(async_scheduling=async_scheduling)
        keep = make_request(chat(engine, PROMPTS[0]), max_tokens=12, ignore_eos=True)
        gone = make_request(chat(engine, PROMPTS[1]), max_tokens=12, ignore_eos=True)
        outputs: list[RequestOutput] = []
        engine.add_request(keep)
        engine.add_request(gone)
        while engine.has_unfinished_requests():
            step = engine.step()
            outputs += step
            mine = [o for o in outputs if o.request_id == gone.request_id]
            if len(mine) == 5 and not mine[-1].finished:
                engine.abort_request(gone.request_id)
        mine = [o for o in outputs if o.request_id == gone.request_id]
        assert mine[-1].finish_reason is FinishReason.CANCELLED
        counts.append((len(mine), mine[-1].num_output_tokens))
    assert counts == [(6, 5), (6, 5)]


def test_the_timed_forward_is_deterministic_and_within_the_vocabulary() -> None:
    tokens = torch.tensor([0, 5, 49151, 5, 17])
    positions = torch.tensor([0, 3, 100, 3, 4000])
    first = timed_forward_token_ids(tokens, positions, 49152)
    assert torch.equal(first, timed_forward_token_ids(tokens, positions, 49152))
    assert first[1] == first[3]  # a function of the last token and its position only
    assert bool(((first >= 0) & (first < 49152)).all())
    assert len(set(first.tolist())) >= 4


def test_a_timed_step_queued_behind_another_starts_when_that_one_ends() -> None:
    device = TimedDevice(0.02)
    queued_at = time.perf_counter()
    first, second = device.run(), device.run()
    assert second.at - first.at == pytest.approx(0.02)
    assert first.at >= queued_at + 0.02
    second.synchronize()  # waits for the second step's end, as a CUDA event would
    assert time.perf_counter() >= second.at
    later = device.run()  # queued after the device went idle: starts when queued
    assert later.at >= second.at + 0.02


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_engine_on_the_timed_forward_serves_every_request(
    make_engine: EngineFactory, async_scheduling: bool
) -> None:
    engine = make_engine(timed_forward_ms=1.0, async_scheduling=async_scheduling)
    sampling = [greedy(max_tokens=5 + i, ignore_eos=True, logprobs=1) for i in range(10)]
    first = engine.generate(requests(engine, sampling, "t1"))
    again = engine.generate(requests(engine, sampling, "t2"))
    for i, params in enumerate(sampling):
        one, two = summarize(first[f"t1{i}"]), summarize(again[f"t2{i}"])
        assert one == two and one[3] == params.max_tokens


def test_timed_forward_async_equals_sync(make_engine: EngineFactory) -> None:
    sampling = [greedy(max_tokens=3 + 2 * i, stop=("e",) if i % 3 == 0 else ()) for i in range(9)]
    sync, overlapped = both(make_engine, sampling, timed_forward_ms=1.0, max_num_seqs=4)
    assert sync == overlapped
