"""The engine's user-visible behaviour on the real model (small runs)."""

from __future__ import annotations

import time

import pytest

from shared.models import FinishReason, SamplingParams
from tests.worker.engine.conftest import EngineFactory
from tests.worker.engine.factories import make_request
from worker.engine import Engine, EngineRequest, RequestOutput


def chat(engine: Engine, text: str) -> list[int]:
    return engine.encode_chat([{"role": "user", "content": text}])


def tokens_of(outputs: list[RequestOutput]) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def text_of(outputs: list[RequestOutput]) -> str:
    return "".join(out.text for out in outputs)


def run_one(engine: Engine, request: EngineRequest) -> list[RequestOutput]:
    return engine.generate([request])[request.request_id]


def sampled(seed: int | None, max_tokens: int = 24) -> SamplingParams:
    return SamplingParams(
        temperature=0.9, top_p=0.95, top_k=100, seed=seed, max_tokens=max_tokens, ignore_eos=True
    )


def test_outputs_stream_tokens_text_and_one_final(engine: Engine) -> None:
    request = make_request(chat(engine, "Name three colors."), max_tokens=12, ignore_eos=True)
    outputs = run_one(engine, request)
    assert [o.index for o in outputs] == list(range(12))
    assert [o.finish_reason for o in outputs] == [None] * 11 + [FinishReason.LENGTH]
    assert outputs[-1].num_output_tokens == 12
    assert outputs[-1].num_prompt_tokens == len(request.prompt_token_ids)
    assert text_of(outputs) == engine.tokenizer.decode(tokens_of(outputs), skip_special_tokens=True)


def test_greedy_is_deterministic(engine: Engine) -> None:
    prompt = chat(engine, "Tell me a fact about owls.")
    first = run_one(engine, make_request(prompt, max_tokens=16))
    second = run_one(engine, make_request(prompt, max_tokens=16))
    assert tokens_of(first) == tokens_of(second)


def test_eos_finishes_with_stop_and_no_special_text(engine: Engine) -> None:
    outputs = run_one(engine, make_request(chat(engine, "Say only: yes"), max_tokens=64))
    assert outputs[-1].finish_reason is FinishReason.STOP
    assert outputs[-1].new_token_ids == [engine.tokenizer.eos_token_id]
    assert "<|im_end|>" not in text_of(outputs)


def test_seeded_sampling_is_the_same_alone_and_in_a_full_batch(engine: Engine) -> None:
    prompt = chat(engine, "Write a poem about rain.")
    alone = tokens_of(run_one(engine, make_request(prompt, sampling=sampled(seed=1234))))
    others = [
        make_request(
            chat(engine, f"Story number {i}."), sampling=sampled(seed=None if i % 2 else i)
        )
        for i in range(31)
    ]
    target = make_request(prompt, sampling=sampled(seed=1234))
    together = engine.generate([*others[:15], target, *others[15:]])
    assert tokens_of(together[target.request_id]) == alone


def test_seeded_sampling_continues_the_same_after_a_resume(engine: Engine) -> None:
    prompt = chat(engine, "Write a poem about snow.")
    full = tokens_of(run_one(engine, make_request(prompt, sampling=sampled(seed=7))))
    resumed = make_request(prompt, sampling=sampled(seed=7), output_token_ids=full[:10])
    outputs = run_one(engine, resumed)
    assert outputs[0].index == 10
    assert tokens_of(outputs) == full[10:]
    assert outputs[-1].num_output_tokens == 24


def test_different_seeds_differ(engine: Engine) -> None:
    prompt = chat(engine, "Write a poem about sand.")
    a = tokens_of(run_one(engine, make_request(prompt, sampling=sampled(seed=1))))
    b = tokens_of(run_one(engine, make_request(prompt, sampling=sampled(seed=2))))
    assert a != b


def test_greedy_resume_continues_without_gap_or_repeat(engine: Engine) -> None:
    prompt = chat(engine, "Explain rain in one paragraph.")
    full = tokens_of(run_one(engine, make_request(prompt, max_tokens=20, ignore_eos=True)))
    resumed = make_request(prompt, max_tokens=20, ignore_eos=True, output_token_ids=full[:7])
    assert tokens_of(run_one(engine, resumed)) == full[7:]


def test_resume_already_at_max_tokens_finishes_at_once(engine: Engine) -> None:
    request = make_request([1, 2, 3], max_tokens=2, output_token_ids=[5, 6])
    outputs = run_one(engine, request)
    assert [(o.new_token_ids, o.finish_reason) for o in outputs] == [([], FinishReason.LENGTH)]


def test_stop_string_spanning_tokens_cuts_the_text(engine: Engine) -> None:
    prompt = chat(engine, "Write a short story about a dragon.")
    free = run_one(engine, make_request(prompt, max_tokens=40, ignore_eos=True))
    text = text_of(free)
    pieces = [str(engine.tokenizer.decode([t])) for t in tokens_of(free)]
    # A stop string made of the end of one token's text and the start of the next.
    k = next(i for i in range(5, len(pieces)) if len(pieces[i]) > 2 and len(pieces[i + 1]) > 2)
    stop = pieces[k][-2:] + pieces[k + 1][:2]
    request = make_request(prompt, max_tokens=40, ignore_eos=True, stop=("never-seen", stop))
    outputs = run_one(engine, request)
    assert outputs[-1].finish_reason is FinishReason.STOP
    assert outputs[-1].stop_sequence == stop
    assert text_of(outputs) == text[: text.index(stop)]


def test_stop_token_ids_stop_after_that_token(engine: Engine) -> None:
    prompt = chat(engine, "Count from one to twenty in words.")
    free = tokens_of(run_one(engine, make_request(prompt, max_tokens=30, ignore_eos=True)))
    stop_id = free[5]
    outputs = run_one(engine, make_request(prompt, max_tokens=30, stop_token_ids=(stop_id,)))
    assert tokens_of(outputs) == free[: free.index(stop_id) + 1]
    assert outputs[-1].finish_reason is FinishReason.STOP


def test_min_tokens_holds_off_eos(engine: Engine) -> None:
    prompt = chat(engine, "Say only: yes")
    short = tokens_of(run_one(engine, make_request(prompt, max_tokens=64)))
    min_tokens = len(short) + 5
    outputs = run_one(engine, make_request(prompt, max_tokens=64, min_tokens=min_tokens))
    tokens = tokens_of(outputs)
    assert len(tokens) >= min_tokens
    assert engine.tokenizer.eos_token_id not in tokens[:min_tokens]


def test_logprobs_report_the_chosen_token_and_top_n(engine: Engine) -> None:
    outputs = run_one(engine, make_request(chat(engine, "Hi!"), max_tokens=4, logprobs=3))
    for out in outputs:
        assert out.logprobs is not None and len(out.logprobs) == 1
        entry = out.logprobs[0]
        assert entry["token_id"] == out.new_token_ids[0]
        assert len(entry["top"]) == 3 and entry["top"][0]["token_id"] == entry["token_id"]
        assert entry["logprob"] == pytest.approx(entry["top"][0]["logprob"])
        assert entry["logprob"] <= 0.0


def test_logprobs_name_the_token_and_each_alternative_as_decoded_alone(engine: Engine) -> None:
    outputs = run_one(engine, make_request(chat(engine, "Hi!"), max_tokens=4, logprobs=3))
    for out in outputs:
        assert out.logprobs is not None
        (entry,) = out.logprobs
        for e in (entry, *entry["top"]):
            assert e["token"] == engine.tokenizer.decode([e["token_id"]], skip_special_tokens=False)


def test_abort_gives_one_final_output_and_nothing_after(engine: Engine) -> None:
    keep = make_request(chat(engine, "Describe a cat."), max_tokens=8, ignore_eos=True)
    gone = make_request(chat(engine, "Describe a dog."), max_tokens=8, ignore_eos=True)
    engine.add_request(keep)
    engine.add_request(gone)
    first = engine.step()  # with asynchronous scheduling, the step is still in flight
    engine.abort_request(gone.request_id)
    outputs: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    mine = [o for o in outputs if o.request_id == gone.request_id]
    assert [(o.new_token_ids, o.finish_reason) for o in mine] == [([], FinishReason.CANCELLED)]
    assert outputs.index(mine[0]) == 0
    assert (
        sum(len(o.new_token_ids) for o in first + outputs if o.request_id == keep.request_id) == 8
    )
    # The cancelled request's usage counts only the tokens it was sent.
    sent = sum(len(o.new_token_ids) for o in first if o.request_id == gone.request_id)
    assert mine[0].num_output_tokens == sent


def test_abort_of_a_waiting_request(make_engine: EngineFactory) -> None:
    engine = make_engine(max_num_seqs=1)
    first = make_request(chat(engine, "One."), max_tokens=3, ignore_eos=True)
    second = make_request(chat(engine, "Two."), max_tokens=3, ignore_eos=True)
    engine.add_request(first)
    engine.add_request(second)
    engine.abort_request(second.request_id, FinishReason.EXPIRED)
    outputs = engine.step()
    assert outputs[0].request_id == second.request_id
    assert outputs[0].finish_reason is FinishReason.EXPIRED
    while engine.has_unfinished_requests():
        assert all(o.request_id == first.request_id for o in engine.step())


def test_a_prompt_seen_before_is_served_from_the_cache_with_the_same_tokens(
    engine: Engine,
) -> None:
    prompt = chat(engine, "List the planets of the solar system with one fact about each.")
    alone = tokens_of(run_one(engine, make_request(prompt, max_tokens=12, ignore_eos=True)))
    # One more reader of the same blocks, cancelled after its first step.
    cancelled = make_request(prompt, max_tokens=12, ignore_eos=True)
    engine.add_request(cancelled)
    engine.step()
    engine.abort_request(cancelled.request_id)
    [final] = engine.step()
    assert final.finish_reason is FinishReason.CANCELLED
    hits_before = engine.kv_cache.num_hit_tokens
    again = tokens_of(run_one(engine, make_request(prompt, max_tokens=12, ignore_eos=True)))
    block_size = engine.kv_cache.block_size
    assert (
        engine.kv_cache.num_hit_tokens - hits_before == (len(prompt) - 1) // block_size * block_size
    )
    assert again == alone


def test_deadline_passing_while_running_finishes_with_timeout(engine: Engine) -> None:
    request = make_request(chat(engine, "Describe the sea."), max_tokens=50, ignore_eos=True)
    request.deadline_unix_s = time.time() + 3600
    engine.add_request(request)
    engine.step()
    request.deadline_unix_s = time.time() - 1
    outputs = engine.step()
    assert [(o.new_token_ids, o.finish_reason) for o in outputs] == [([], FinishReason.TIMEOUT)]
    assert not engine.has_unfinished_requests()


def test_a_critical_request_preempts_a_full_batch_and_everyone_stays_correct(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(max_num_seqs=2)
    prompts = [chat(engine, t) for t in ("About trees.", "About rivers.", "About stars.")]
    alone = [
        tokens_of(run_one(engine, make_request(p, max_tokens=10, ignore_eos=True))) for p in prompts
    ]
    low = [make_request(p, max_tokens=10, ignore_eos=True, priority=25) for p in prompts[:2]]
    for request in low:
        engine.add_request(request)
    outputs = engine.step()
    critical = make_request(prompts[2], max_tokens=10, ignore_eos=True, priority=100)
    engine.add_request(critical)
    first_step = engine.step()
    if engine.config.async_scheduling:  # the step that computes its first token is in flight
        first_step += engine.step()
    assert critical.request_id in {o.request_id for o in first_step}
    outputs += first_step
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert engine.scheduler.num_preemptions >= 1
    for request, expected in zip([*low, critical], alone, strict=True):
        assert tokens_of([o for o in outputs if o.request_id == request.request_id]) == expected


def test_rejects_a_prompt_that_does_not_fit(engine: Engine) -> None:
    too_long = make_request([1] * engine.max_model_len)
    with pytest.raises(ValueError, match="shorten the prompt"):
        engine.add_request(too_long)
    with pytest.raises(ValueError, match="no tokens"):
        engine.add_request(make_request([]))


def test_a_request_the_kv_pool_can_never_hold_is_refused_naming_the_limit(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(kv_cache_mib=4)
    pool_tokens = engine.kv_cache.num_blocks * engine.kv_cache.block_size
    prompt = chat(engine, "Hi.")
    too_long = make_request(prompt, max_tokens=pool_tokens - len(prompt) + 1)
    with pytest.raises(ValueError, match=rf"over the {pool_tokens} that this worker's KV cache"):
        engine.add_request(too_long)
    fits = make_request(prompt, max_tokens=pool_tokens - len(prompt), ignore_eos=True)
    outputs = run_one(engine, fits)
    assert outputs[-1].finish_reason is FinishReason.LENGTH
    assert outputs[-1].num_output_tokens == pool_tokens - len(prompt)


def test_rejects_a_duplicate_request_id(engine: Engine) -> None:
    engine.add_request(make_request([1, 2, 3], request_id="dup", max_tokens=2))
    with pytest.raises(ValueError, match="already"):
        engine.add_request(make_request([1, 2, 3], request_id="dup", max_tokens=2))


def test_free_slots_shrink_as_requests_are_added(make_engine: EngineFactory) -> None:
    engine = make_engine(max_num_seqs=2)
    start = engine.num_free_slots()
    assert start >= 2
    engine.add_request(make_request([1, 2, 3], max_tokens=2))
    assert engine.num_free_slots() == start - 1
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.num_free_slots() == start


def test_once_the_batch_is_full_the_look_ahead_is_claimed_two_at_a_time(
    make_engine: EngineFactory,
) -> None:
    """Two rows and four look-ahead slots: while a row is idle the engine takes what
    fits; then one free look-ahead slot is not worth a claim's round trips, two are."""
    engine = make_engine(max_num_seqs=2, num_lookahead_slots=4)
    free = []
    for n in range(6):
        free.append(engine.num_free_slots())
        engine.add_request(make_request([1, 2, 3], request_id=f"r{n}", max_tokens=4))
    free.append(engine.num_free_slots())
    assert free == [6, 5, 4, 3, 2, 0, 0]
    engine.abort_request("r5")
    engine.step()  # the abort takes effect
    assert engine.num_free_slots() == 0  # one slot free: wait for a second
    engine.abort_request("r4")
    engine.step()
    assert engine.num_free_slots() == 2
