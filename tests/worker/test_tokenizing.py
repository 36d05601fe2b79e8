"""Requests for the tokenizer alone (task tokenize / detokenize): answered at admission
without the engine, and hostile ones, written to Redis by hand, end alone (an error
final, or the dead-letter set) while the worker keeps serving."""

from __future__ import annotations

from typing import Any

import fakeredis
import orjson
import pytest

from producer.client import Client
from shared.keys import Keys, model_tag, new_request_id
from shared.models import FinalEvent, FinishReason, RequestState
from shared.settings import Settings
from tests.conftest import serve
from tests.worker.fakes import ScriptedEngine, lockstep
from worker.service import WorkerService

MODEL = "m"
KEYS = Keys()


@pytest.fixture
def setup(fake_redis: fakeredis.FakeRedis) -> tuple[Client, WorkerService, ScriptedEngine]:
    settings = Settings(publish_coalesce_ms=0)
    serve(fake_redis, MODEL)
    engine = ScriptedEngine()
    service = lockstep(WorkerService(engine, fake_redis, settings, MODEL, "w1"))
    return Client(connection=fake_redis, settings=settings), service, engine


def _enqueue(connection: fakeredis.FakeRedis, payload: dict[str, Any] | str) -> str:
    """A request written to Redis by hand, as a hostile producer could."""
    request_id = new_request_id(MODEL)
    raw = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
    connection.hset(
        KEYS.request(request_id),
        mapping={"payload": raw, "state": "queued", "model": MODEL, "priority": 75},
    )
    connection.zadd(KEYS.queue(model_tag(MODEL)), {request_id: 1})
    return request_id


def _final(connection: fakeredis.FakeRedis, request_id: str) -> FinalEvent:
    entries: Any = connection.xrange(KEYS.stream(request_id))
    assert len(entries) == 1  # the final alone: no token was generated
    return FinalEvent.model_validate_json(entries[0][1][b"e"])


def test_tokenize_and_detokenize_are_answered_without_the_engine(
    setup: Any, fake_redis: fakeredis.FakeRedis
) -> None:
    client, service, engine = setup
    text = _enqueue(fake_redis, {"model": MODEL, "prompt": "a b c", "task": "tokenize"})
    bare = _enqueue(
        fake_redis,
        {"model": MODEL, "prompt": "a b", "task": "tokenize", "add_special_tokens": False},
    )
    chat = _enqueue(
        fake_redis,
        {"model": MODEL, "messages": [{"role": "user", "content": "x y"}], "task": "tokenize"},
    )
    ids = _enqueue(fake_redis, {"model": MODEL, "prompt_token_ids": [3, 4], "task": "detokenize"})
    service.run(burst=True)
    assert engine.added == []
    assert _final(fake_redis, text).prompt_token_ids == (0, 1, 2)  # as a prompt is encoded
    assert _final(fake_redis, bare).prompt_token_ids == (0, 1)
    assert _final(fake_redis, chat).prompt_token_ids == (0, 1)  # through encode_chat
    answer = _final(fake_redis, ids)
    assert (answer.detokenized, answer.finish_reason) == ("w3 w4", FinishReason.STOP)
    assert answer.usage.total_tokens == 0  # the model did not run
    assert client.handle(ids).status().state is RequestState.FINISHED


@pytest.mark.parametrize(
    ("payload", "dead", "error"),
    [
        ({"model": MODEL, "prompt_token_ids": [1, 5000], "task": "detokenize"}, False,
         "prompt_token_ids[1] is 5000, outside the model's vocabulary"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "boom"}], "task": "tokenize"},
         False, "cannot run this request: the template refused"),
        ({"model": MODEL, "prompt": "x", "task": "detokenize"}, True, "takes prompt_token_ids"),
        ({"model": MODEL, "prompt": "x", "task": "tokenise"}, True, "unreadable payload"),
        ({"model": MODEL, "prompt_token_ids": [-1], "task": "detokenize"}, True,
         "unreadable payload"),
        ({"model": MODEL, "prompt": "x", "task": "detokenize", "add_special_tokens": "no"},
         True, "unreadable payload"),
        ('{"model": "m", "task": "tokenize", "prompt": ' + "[" * 5000, True,
         "unreadable payload"),
    ],
)  # fmt: skip
def test_a_hostile_tokenizer_request_ends_alone_and_the_worker_keeps_serving(
    setup: Any,
    fake_redis: fakeredis.FakeRedis,
    monkeypatch: pytest.MonkeyPatch,
    payload: dict[str, Any] | str,
    dead: bool,
    error: str,
) -> None:
    client, service, engine = setup

    def encode_chat(messages: list[dict[str, Any]], *_: object) -> list[int]:
        if messages[0]["content"] == "boom":
            raise ValueError("the template refused these messages")
        return [1]

    monkeypatch.setattr(engine, "encode_chat", encode_chat)
    bad = _enqueue(fake_redis, payload)
    good = client.submit("fine", model=MODEL, max_tokens=2)
    service.run(burst=True)
    result = client.handle(bad).result(timeout=1)
    assert result.finish_reason is FinishReason.ERROR
    assert error in (result.error or "")
    state = client.handle(bad).status().state
    assert state is (RequestState.DEAD if dead else RequestState.FAILED)
    assert good.result(timeout=1).text == "t0t1"


def test_a_final_leaves_the_newer_fields_out_when_unset(
    setup: Any, fake_redis: fakeredis.FakeRedis
) -> None:
    """So a gateway of the release before (which refuses fields it does not know) still
    reads every final a worker writes during a rolling upgrade."""
    client, service, _ = setup
    plain = client.submit("p q", model=MODEL, max_tokens=2)
    counted = _enqueue(fake_redis, {"model": MODEL, "prompt": "a b", "task": "tokenize"})
    service.run(burst=True)
    entries: Any = fake_redis.xrange(KEYS.stream(plain.id))
    written = orjson.loads(entries[-1][1][b"e"])
    assert written["type"] == "final"
    assert not {"prompt_token_ids", "detokenized", "stop_sequence"} & set(written)
    answer = orjson.loads(fake_redis.xrange(KEYS.stream(counted))[0][1][b"e"])  # type: ignore[index]
    assert answer["prompt_token_ids"] == [0, 1] and "detokenized" not in answer
