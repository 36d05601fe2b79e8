"""Every Lua script, against fakeredis and a real redis-server."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from producer.client import Client
from shared.calls import (
    Claimed,
    TokenPublish,
    admit_call,
    enqueue_call,
    finish_call,
    parse_finish,
    publish_calls,
    renew_call,
    settle_call,
)
from shared.connection import is_cluster
from shared.errors import QueueFull
from shared.fairness import estimated_tokens, units
from shared.flows import claim_flow, drive
from shared.keys import (
    Keys,
    idempotency_digest,
    legacy_idempotency_tag,
    model_tag,
    new_request_id,
)
from shared.models import (
    FinalEvent,
    FinishReason,
    GenerationRequest,
    RequestState,
    TokenEvent,
    dumps,
)
from shared.priority import queue_score
from shared.replies import text
from shared.scripts import ScriptCall, Scripts
from shared.settings import Settings

MODEL = "SmolLM2-135M-Instruct"
TAG = model_tag(MODEL)


def claim(r: redis.Redis, settings: Settings, n: int, worker: str = "w1") -> list[Claimed]:
    keys = Keys(settings.namespace)
    ids = [text(i) for i in r.zrange(keys.queue(TAG), 0, n - 1)]
    return drive(Scripts(r), claim_flow(keys, settings, TAG, worker, ids)) if ids else []


def test_higher_priority_first_and_fifo_within_a_priority(client: Client) -> None:
    order = ["low", "normal", "critical", "low", "high", "critical", "normal", 60]
    handles = [client.submit(f"p{i}", priority=p) for i, p in enumerate(order)]
    claimed = [c.request_id for c in claim(client.redis, client.settings, len(order))]
    by_id = {h.id: i for i, h in enumerate(handles)}
    assert [by_id[c] for c in claimed] == [2, 5, 4, 7, 1, 6, 0, 3]


def test_scripts_score_the_queue_as_queue_score_says(client: Client) -> None:
    """Within its band a request sits at its tenant's virtual start time (shared.fairness):
    0 for each band's first, then what the one before it was charged."""
    handles = [client.submit("a", priority="low"), client.submit("b", priority=99)]
    handles.append(client.submit("c", priority="low"))
    cost = units(estimated_tokens(GenerationRequest(model=MODEL, prompt="a")), 1.0)
    keys = Keys()
    for h, priority, start in zip(handles, (25, 99, 25), (0, 0, cost), strict=True):
        assert client.redis.zscore(keys.queue(TAG), h.id) == queue_score(priority, start)


def test_position_counts_requests_ahead(client: Client) -> None:
    low = client.submit("a", priority="low")
    high = client.submit("b", priority="high")
    assert (high.position(), low.position()) == (0, 1)
    claim(client.redis, client.settings, 1)
    assert (high.position(), low.position()) == (None, 0)


def test_full_queue_refuses_and_keeps_what_it_accepted(client: Client) -> None:
    accepted = [client.submit(f"x{i}") for i in range(client.settings.max_queued)]
    with pytest.raises(QueueFull, match="is full"):
        client.submit("one too many")
    assert client.redis.zcard(Keys().queue(TAG)) == len(accepted)
    assert all(h.status().state is RequestState.QUEUED for h in accepted)


def test_idempotency_key_returns_the_original_request(client: Client) -> None:
    first = client.submit("a", idempotency_key="order-17")
    again = client.submit("a", idempotency_key="order-17")
    assert again.id == first.id
    assert client.redis.zcard(Keys().queue(TAG)) == 1


def test_an_idempotency_key_is_scoped_to_its_tenant(client: Client) -> None:
    acme = client.submit("a", idempotency_key="order-17", metadata={"tenant": "acme"})
    beta = client.submit("b", idempotency_key="order-17", metadata={"tenant": "beta"})
    acme_again = client.submit("a", idempotency_key="order-17", metadata={"tenant": "acme"})
    assert beta.id != acme.id and acme_again.id == acme.id
    assert (acme.status().tenant, beta.status().tenant) == ("acme", "beta")
    assert client.redis.zcard(Keys().queue(TAG)) == 2


def test_a_key_from_before_the_bounded_slots_still_finds_its_request(client: Client) -> None:
    # A producer from before kept the key on the slot of the digest's first 16 hex, and
    # gave the request that tag; a retry through this version must find it, not submit again.
    keys, scripts = client.keys, Scripts(client.redis)
    req = GenerationRequest(model=MODEL, prompt="a", idempotency_key="order-17")
    digest = idempotency_digest(MODEL, "order-17", req.tenant)
    old_id = new_request_id(MODEL, legacy_idempotency_tag(digest))
    admit = admit_call(keys, client.settings, old_id, req, digest)
    old_admit = ScriptCall("admit", [admit.keys[0], keys.legacy_idempotency(digest)], admit.args)
    scripts.send([old_admit])
    scripts.send([enqueue_call(keys, client.settings, old_id, req)])
    again = client.submit("a", idempotency_key="order-17")
    assert again.id == old_id
    assert client.redis.zcard(Keys().queue(TAG)) == 1


def test_a_request_is_claimed_once_even_when_two_workers_race(client: Client) -> None:
    client.submit("a")
    keys, s = client.keys, client.settings
    ids = [text(i) for i in client.redis.zrange(keys.queue(TAG), 0, 0)]
    scripts = Scripts(client.redis)
    first = drive(scripts, claim_flow(keys, s, TAG, "w1", ids))
    second = drive(scripts, claim_flow(keys, s, TAG, "w2", ids))
    assert len(first) == 1 and second == []
    status = client.handle(ids[0]).status()
    assert (status.state, status.worker, status.attempts) == (RequestState.RUNNING, "w1", 1)


def test_claim_expires_a_request_whose_deadline_passed(client: Client) -> None:
    h = client.submit("late", deadline=0.001)
    time.sleep(0.01)
    assert claim(client.redis, client.settings, 5) == []
    result = h.result(timeout=1)
    assert result.finish_reason is FinishReason.EXPIRED
    assert h.status().state is RequestState.EXPIRED


def publish_token(r: redis.Redis, c: Claimed, index: int, text: str) -> int:
    event = dumps(TokenEvent(index=index, token_ids=(index,), text=text))
    calls = publish_calls(
        Keys(), [TokenPublish(c.request_id, c.lease_token, event, index, 1)], True
    )
    (code,) = Scripts(r).run(calls[0])
    return int(code)


def _finish(r: redis.Redis, s: Settings, c: Claimed, text: str, n: int) -> Any:
    final = dumps(FinalEvent(finish_reason=FinishReason.LENGTH))
    output = f'{{"text": "{text}", "token_ids": {list(range(n))}}}'.encode()
    call = finish_call(Keys(), s, c.request_id, c.lease_token, final, output, "finished")
    reply = Scripts(r).run(call)
    moved = parse_finish(reply, c.request_id, c.lease_token)
    if moved is not None:
        Scripts(r).run(settle_call(Keys(), TAG, [moved]))
    return reply[0] if moved is not None else reply


def test_publish_and_finish_build_the_stream_and_result(client: Client) -> None:
    h = client.submit("hi")
    (c,) = claim(client.redis, client.settings, 1)
    assert publish_token(client.redis, c, 0, "Hel") == 1
    assert publish_token(client.redis, c, 1, "lo") == 1
    written = FinalEvent.model_validate_json(_finish(client.redis, client.settings, c, "Hello", 2))
    assert written.finish_reason is FinishReason.LENGTH
    events = [e.event for e in h.stream()]
    assert [e.text for e in events if isinstance(e, TokenEvent)] == ["Hel", "lo"]
    assert isinstance(events[-1], FinalEvent)
    result = h.result(timeout=1)
    assert (result.text, result.finish_reason) == ("Hello", FinishReason.LENGTH)
    assert result.timings.total_s is not None and result.timings.ttft_s is not None


def test_stream_resumes_after_a_given_event(client: Client) -> None:
    h = client.submit("hi")
    (c,) = claim(client.redis, client.settings, 1)
    for i, piece in enumerate(["a", "b", "c"]):
        publish_token(client.redis, c, i, piece)
    _finish(client.redis, client.settings, c, "abc", 3)
    events = list(h.stream())
    rest = list(h.stream(after=events[0].id))
    assert [e.id for e in rest] == [e.id for e in events[1:]]


def test_a_stale_lease_token_cannot_publish_or_finish(client: Client) -> None:
    h = client.submit("hi")
    (c,) = claim(client.redis, client.settings, 1)
    stale = Claimed(c.request_id, "w1:0", c.payload, c.attempts, 0)
    assert publish_token(client.redis, stale, 0, "x") == 0
    assert _finish(client.redis, client.settings, stale, "x", 1) == 0
    assert client.redis.xlen(Keys().stream(h.id)) == 0
    assert h.status().state is RequestState.RUNNING


def test_cancel_removes_a_queued_request_at_once(client: Client) -> None:
    h = client.submit("never")
    assert h.cancel() == "cancelled"
    assert claim(client.redis, client.settings, 5) == []
    assert h.result(timeout=1).finish_reason is FinishReason.CANCELLED


def test_cancel_of_a_running_request_is_seen_bypublish_token(client: Client) -> None:
    h = client.submit("hi")
    (c,) = claim(client.redis, client.settings, 1)
    assert h.cancel() == "requested"
    assert publish_token(client.redis, c, 0, "x") == 2
    call = renew_call(client.keys, client.settings, TAG, {c.request_id: c.lease_token})
    assert list(Scripts(client.redis).run(call)) == [1]


def test_renew_extends_only_leases_still_held(client: Client) -> None:
    client.submit("a")
    client.submit("b")
    c1, c2 = claim(client.redis, client.settings, 2)
    held = {c1.request_id: c1.lease_token, c2.request_id: "someone-else:1"}
    call = renew_call(client.keys, client.settings, TAG, held)
    assert list(Scripts(client.redis).run(call)) == [1, 0]


def test_one_publish_call_serves_a_whole_step_with_a_code_per_request(client: Client) -> None:
    handles = [client.submit(f"p{i}") for i in range(3)]
    claimed = claim(client.redis, client.settings, 3)
    event = dumps(TokenEvent(index=0, token_ids=(7,), text="x"))
    items = [TokenPublish(c.request_id, c.lease_token, event, 0, 1) for c in claimed]
    items[1] = TokenPublish(claimed[1].request_id, "stale:1", event, 0, 1)
    items.append(TokenPublish(claimed[2].request_id, claimed[2].lease_token, event, 5, 1))
    # One call for the step on one Redis; one per request on a cluster (one slot each).
    calls = publish_calls(Keys(), items, cluster=is_cluster(client.redis))
    codes = [code for call in calls for code in Scripts(client.redis).run(call)]
    assert codes == [1, 0, 1, 3]
    by_id = {h.id: h for h in handles}
    assert [by_id[c.request_id].status().num_generated for c in claimed] == [1, 0, 1]


def test_a_request_written_by_hand_without_fields_still_has_a_readable_status(
    client: Client,
) -> None:
    rid = client.handle(f"{TAG}-{'a' * 24}").id
    client.redis.hset(Keys().request(rid), mapping={"state": "dead"})
    status = client.handle(rid).status()
    assert (status.state, status.priority, status.model) == (RequestState.DEAD, 0, "")
