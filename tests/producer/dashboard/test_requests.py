from __future__ import annotations

import time

import pytest

from producer.dashboard.requests import MAX_PROMPT_CHARS, request_detail, request_list
from shared.errors import InvalidRequest, NotFound
from shared.keys import model_tag
from shared.models import FinishReason
from tests.producer.dashboard.conftest import MODEL, World


async def _ids(world: World, kind: str) -> list[str]:
    rows = await request_list(world.aio, world.keys, [model_tag(MODEL)], kind, 50)  # type: ignore[arg-type]
    return [r.id for r in rows]


async def test_lists_by_kind(world: World) -> None:
    running, done, failed, dead = world.submit(4)
    claims = {c.request_id: c for c in world.claim("w1", running, done, failed, dead)}
    low, high = world.submit(1, "low") + world.submit(1, "high")
    for rid, state in ((done, "finished"), (failed, "failed"), (dead, "dead")):
        time.sleep(0.005)  # distinct end times: the lists order by them
        world.finish(claims[rid], FinishReason.STOP if rid == done else FinishReason.ERROR, state)
    assert await _ids(world, "running") == [running]
    assert await _ids(world, "queued") == [high, low]
    assert await _ids(world, "recent") == [dead, failed, done]
    assert await _ids(world, "failed") == [dead, failed]
    assert await _ids(world, "dead") == [dead]


async def test_running_row_has_worker_tokens_and_ttft(world: World) -> None:
    [rid] = world.submit(1, "high")
    [claimed] = world.claim("w1", rid)
    world.publish(claimed, "hi")
    [row] = await request_list(world.aio, world.keys, [model_tag(MODEL)], "running", 10)
    assert (row.state, row.worker, row.priority_name, row.attempts) == ("running", "w1", "high", 1)
    assert row.num_generated == 1
    assert row.ttft_s is not None and row.ttft_s >= 0


async def test_detail_has_parameters_timings_and_position(world: World) -> None:
    _, second = world.submit(2, max_tokens=7, temperature=0.0, metadata={"user": "u1"})
    detail = await request_detail(world.aio, world.keys, second)
    assert (detail.state, detail.position, detail.prompt) == ("queued", 1, "hello there")
    assert detail.parameters["sampling"]["max_tokens"] == 7
    assert detail.parameters["metadata"] == {"user": "u1"}
    assert detail.created_ms is not None and detail.started_ms is None


async def test_detail_truncates_a_long_prompt(world: World) -> None:
    rid = world.client.submit("x" * (MAX_PROMPT_CHARS + 10), model=MODEL).id
    detail = await request_detail(world.aio, world.keys, rid)
    assert detail.prompt_truncated is True
    assert len(detail.prompt or "") == MAX_PROMPT_CHARS


async def test_detail_shows_a_token_id_prompt_as_text_not_as_parameters(world: World) -> None:
    rid = world.client.submit(prompt_token_ids=list(range(3000)), model=MODEL).id
    detail = await request_detail(world.aio, world.keys, rid)
    assert (detail.prompt or "").startswith("(token ids, 3000) 0 1 2 ")
    assert detail.prompt_truncated is True
    assert "prompt_token_ids" not in detail.parameters


async def test_detail_of_a_dead_request_says_why(world: World) -> None:
    [rid] = world.submit(1)
    [claimed] = world.claim("w1", rid)
    world.finish(claimed, FinishReason.ERROR, state="dead")
    detail = await request_detail(world.aio, world.keys, rid)
    assert (detail.state, detail.dead_reason) == ("dead", "boom")
    assert detail.final is not None and detail.final["finish_reason"] == "error"


async def test_unknown_and_malformed_ids(world: World) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        await request_detail(world.aio, world.keys, f"{model_tag(MODEL)}-{'0' * 24}")
    with pytest.raises(InvalidRequest, match="malformed request id"):
        await request_detail(world.aio, world.keys, "nope")
