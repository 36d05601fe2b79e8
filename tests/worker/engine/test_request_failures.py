"""A request's failure is that request's: an exception at any stage of one request
ends it with an error its client reads, the others finish exactly as they would have,
and the worker serves on (the real engine behind the real worker loop, fakeredis)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest

from producer.client import Client, Handle
from producer.refusals import refusal_of
from shared.keys import Keys, model_tag
from shared.models import FinishReason, RequestState, Result
from shared.reaper import reap_once
from shared.scripts import Scripts
from shared.settings import Settings
from tests.conftest import serve
from worker.coalesce import step_wire
from worker.engine import Engine
from worker.engine.grammar import Grammars
from worker.engine.model_runner import ModelRunner
from worker.engine.token_output import TextState
from worker.service import WorkerService

MODEL = "m"
PROMPTS = ("Name a color.", "Count to three.", "Say hello.")
SETTINGS = Settings(publish_coalesce_ms=0)

Inject = Callable[[pytest.MonkeyPatch, Engine, str], None]


class Boom(Exception):
    """The injected failure."""


@pytest.fixture
def served(
    fake_redis: fakeredis.FakeRedis, engine: Engine
) -> Iterator[tuple[Client, WorkerService]]:
    serve(fake_redis, MODEL)
    service = WorkerService(engine, fake_redis, SETTINGS, MODEL, "w1")
    yield Client(connection=fake_redis, settings=SETTINGS), service
    service.close()


def submit(client: Client, prompt: str, **sampling: Any) -> Handle:
    return client.submit(prompt, model=MODEL, max_tokens=6, temperature=0.0, **sampling)


def results(handles: list[Handle]) -> list[Result]:
    return [h.result(timeout=1) for h in handles]


def in_admission(monkeypatch: pytest.MonkeyPatch, engine: Engine, bad_id: str) -> None:
    encode = engine.encode_prompt

    def failing(prompt: str) -> list[int]:
        if prompt == "bad":
            raise Boom("admission")
        return encode(prompt)

    monkeypatch.setattr(engine, "encode_prompt", failing)


def in_grammar(monkeypatch: pytest.MonkeyPatch, engine: Engine, bad_id: str) -> None:
    def failing(self: Grammars, params: Any) -> Any:
        raise Boom("grammar")

    monkeypatch.setattr(Grammars, "_compile", failing)


def in_sampling(monkeypatch: pytest.MonkeyPatch, engine: Engine, bad_id: str) -> None:
    row = ModelRunner._sampling_row

    def failing(self: ModelRunner, item: Any) -> Any:
        if item.seq.request_id == bad_id and item.seq.num_output_tokens >= 2:
            raise Boom("sampling")
        return row(self, item)

    monkeypatch.setattr(ModelRunner, "_sampling_row", failing)


class FailingDetokenizer:
    def add(self, token_ids: list[int]) -> str:
        raise Boom("detokenizing")


def in_detokenizing(monkeypatch: pytest.MonkeyPatch, engine: Engine, bad_id: str) -> None:
    init = TextState.__init__

    def failing(self: Any, tokenizer: Any, seq: Any, *args: Any) -> None:
        init(self, tokenizer, seq, *args)
        if seq.request_id == bad_id:
            self.detokenizer = FailingDetokenizer()

    monkeypatch.setattr(TextState, "__init__", failing)


def in_publishing(monkeypatch: pytest.MonkeyPatch, engine: Engine, bad_id: str) -> None:
    def failing(out: Any) -> bytes:
        if out.request_id == bad_id and out.index >= 1:
            raise Boom("publishing")
        return step_wire(out)

    monkeypatch.setattr("worker.publisher.step_wire", failing)


STAGES: dict[str, Inject] = {
    "admission": in_admission,
    "grammar": in_grammar,
    "sampling": in_sampling,
    "detokenizing": in_detokenizing,
    "publishing": in_publishing,
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_failure_at_any_stage_of_one_request_is_that_requests_alone(
    served: tuple[Client, WorkerService], monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    client, service = served
    baseline = [submit(client, p) for p in PROMPTS]
    service.run(burst=True)
    expected = results(baseline)

    guided = {"guided_regex": f"(failing {stage})+"} if stage == "grammar" else {}
    handles = [submit(client, p) for p in PROMPTS[:2]]
    bad = submit(client, "bad" if stage == "admission" else PROMPTS[0], **guided)
    handles.append(submit(client, PROMPTS[2]))
    STAGES[stage](monkeypatch, service.engine, bad.id)  # type: ignore[arg-type]
    service.run(burst=True)

    failed = bad.result(timeout=1)
    assert failed.finish_reason is FinishReason.ERROR
    assert failed.error is not None and stage in failed.error
    # The service's own failure, never read as the client's mistake (a 400).
    assert refusal_of(failed) is None
    assert bad.status().state is RequestState.FAILED
    assert [(r.text, r.token_ids) for r in results(handles)] == [
        (r.text, r.token_ids) for r in expected
    ]
    monkeypatch.undo()
    after = submit(client, PROMPTS[1])
    service.run(burst=True)  # the worker serves on
    assert after.result(timeout=1).token_ids == expected[1].token_ids
    assert client.redis.zcard(client.keys.dead(model_tag(MODEL))) == 0


def test_a_step_that_fails_for_no_one_request_ends_its_requests_and_the_worker_serves_on(
    served: tuple[Client, WorkerService],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, service = served
    run_step = ModelRunner.run_step  # a step's forward and sampling, either scheduling
    calls = iter(range(1_000))

    def failing(self: ModelRunner, *args: Any, **kwargs: Any) -> Any:
        if next(calls) == 1:
            raise Boom("the whole step")
        return run_step(self, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "run_step", failing)
    handles = [submit(client, p) for p in PROMPTS]
    service.run(burst=True)
    for result in results(handles):
        assert result.finish_reason is FinishReason.ERROR
        assert result.error is not None and "the whole step" in result.error
        assert refusal_of(result) is None
    assert [r.levelname for r in caplog.records if r.exc_info] == ["ERROR"]  # logged once
    after = submit(client, PROMPTS[1])
    service.run(burst=True)
    assert after.result(timeout=1).finish_reason is FinishReason.LENGTH


def test_a_resumed_request_whose_stream_holds_an_unreadable_entry_fails_alone(
    served: tuple[Client, WorkerService], fake_redis: fakeredis.FakeRedis, engine: Engine
) -> None:
    client, _ = served
    dying = WorkerService(engine, fake_redis, SETTINGS, MODEL, "w-dead")
    bad = submit(client, PROMPTS[0])
    for _ in range(10):  # claims it, computes a token (read a step later) and streams it
        dying.iterate()
        if fake_redis.xlen(Keys().stream(bad.id)):
            break  # then "dies" (its lease lapses)
    engine.abort_request(bad.id)
    engine.step()  # the dead worker's engine lets go (the test shares one engine)
    dying.close()
    fake_redis.xadd(Keys().stream(bad.id), {"e": b"{not json"})
    fake_redis.zadd(Keys().leases(model_tag(MODEL)), {bad.id: 0})
    reap_once(fake_redis, Scripts(fake_redis), SETTINGS, model_tag(MODEL), "reaper")
    good = submit(client, PROMPTS[1])
    _, service = served
    service.run(burst=True)
    failed = bad.result(timeout=1)
    assert failed.finish_reason is FinishReason.ERROR
    assert failed.error is not None and "unreadable entry" in failed.error
    assert refusal_of(failed) is None
    assert bad.status().state is RequestState.FAILED
    assert good.result(timeout=1).finish_reason is FinishReason.LENGTH
    assert fake_redis.zcard(Keys().dead(model_tag(MODEL))) == 0
