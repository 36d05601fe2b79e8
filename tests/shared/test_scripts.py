"""Every Lua script, against fakeredis and a real redis-server."""

from __future__ import annotations

import time

import pytest
import redis

from producer.client import Client
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
from shared.ops.claim import Claim, Claimed
from shared.ops.moves import Fate, Moved, Settle
from shared.ops.publish import Final, Finish, Publish, PublishCode, TokenPublish
from shared.ops.renew import Renew, RenewCode
from shared.ops.submit import Admit, Enqueue
from shared.priority import queue_score
from shared.replies import text
from shared.scripts import ScriptCall, Scripts, load_source
from shared.settings import Settings
from tests.conftest import as_tenant

MODEL = "SmolLM2-135M-Instruct"
TAG = model_tag(MODEL)


def claim(r: redis.Redis, settings: Settings, n: int, worker: str = "w1") -> list[Claimed]:
    keys = Keys(settings.namespace)
    flow = claim_flow(keys, settings, Claim(TAG, worker, settings.lease_ms, n, n), cluster=True)
    return drive(Scripts(r), flow)


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
    acme = as_tenant(client, "acme").submit("a", idempotency_key="order-17")
    beta = as_tenant(client, "beta").submit("b", idempotency_key="order-17")
    acme_again = as_tenant(client, "acme").submit("a", idempotency_key="order-17")
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
    admit = Admit(old_id, req, digest).call(keys, client.settings)
    legacy = keys.legacy_idempotency(digest)  # and a body key on its slot, never read
    old_admit = ScriptCall("admit", [admit.keys[0], legacy, f"{legacy}:body"], admit.args)
    scripts.send([old_admit])
    scripts.send([Enqueue(old_id, req).call(keys, client.settings)])
    again = client.submit("a", idempotency_key="order-17")
    assert again.id == old_id
    assert client.redis.zcard(Keys().queue(TAG)) == 1


def test_a_request_is_claimed_once_even_when_two_workers_race(client: Client) -> None:
    client.submit("a")
    keys, s = client.keys, client.settings
    ids = [text(i) for i in client.redis.zrange(keys.queue(TAG), 0, 0)]
    scripts = Scripts(client.redis)
    first = drive(scripts, claim_flow(keys, s, Claim(TAG, "w1", s.lease_ms, 1, 1)))
    second = drive(scripts, claim_flow(keys, s, Claim(TAG, "w2", s.lease_ms, 1, 1)))
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


def publish_token(r: redis.Redis, c: Claimed, index: int, text: str) -> PublishCode:
    event = dumps(TokenEvent(index=index, token_ids=(index,), text=text))
    publish = Publish([TokenPublish(c.request_id, c.lease_token, event, index, 1)])
    (call,) = publish.calls(Keys(), Settings().result_ttl_s, cluster=True)
    (written,) = publish.parse([Scripts(r).run(call)])
    return written.code


def _finish(r: redis.Redis, s: Settings, c: Claimed, text: str, n: int) -> str | None:
    """The final event's json, or None when the lease was lost."""
    final = FinalEvent(finish_reason=FinishReason.LENGTH)
    output = f'{{"text": "{text}", "token_ids": {list(range(n))}}}'.encode()
    finish = Finish(c.request_id, c.lease_token, final, output, Fate.FINISHED)
    finished = finish.parse(Scripts(r).run(finish.call(Keys(), s.result_ttl_s)))
    if finished is None:
        return None
    Scripts(r).run(Settle(TAG, [finished.moved]).call(Keys()))
    return finished.final_json


def test_publish_and_finish_build_the_stream_and_result(client: Client) -> None:
    h = client.submit("hi")
    (c,) = claim(client.redis, client.settings, 1)
    assert publish_token(client.redis, c, 0, "Hel") is PublishCode.PUBLISHED
    assert publish_token(client.redis, c, 1, "lo") is PublishCode.PUBLISHED
    final = _finish(client.redis, client.settings, c, "Hello", 2)
    assert final is not None
    written = FinalEvent.model_validate_json(final)
    assert written.finish_reason is FinishReason.LENGTH
    events = [e.event for e in h.stream()]
    assert [e.text for e in events if isinstance(e, TokenEvent)] == ["Hel", "lo"]
    assert isinstance(events[-1], FinalEvent)
    result = h.result(timeout=1)
    assert (result.text, result.finish_reason) == ("Hello", FinishReason.LENGTH)
    assert result.timings.total_s is not None and result.timings.ttft_s is not None


def test_a_final_is_stored_as_the_worker_wrote_it_with_its_timings_added(
    client: Client,
) -> None:
    """The script adds the timings to the worker's final without decoding it: an error
    that looks like JSON stays as it was, and an embedding keeps every digit."""
    h = client.submit("hi")
    (c,) = claim(client.redis, client.settings, 1)
    error = 'bad {"timings": {"total_s": 1}, "x": "}"} \\ \u00e9'
    vector = (0.1234567890123456789, -1e-30, 3.0000000000000004)
    event = FinalEvent(finish_reason=FinishReason.ERROR, error=error, embedding=vector)
    finish = Finish(c.request_id, c.lease_token, event, b"{}", Fate.FAILED)
    finished = finish.parse(Scripts(client.redis).run(finish.call(Keys(), 60)))
    assert finished is not None
    stored_json = client.redis.hget(Keys().request(h.id), "final")
    assert stored_json is not None
    stored = FinalEvent.model_validate_json(stored_json)
    assert (stored.finish_reason, stored.error, stored.embedding) == (
        FinishReason.ERROR, error, vector,
    )  # fmt: skip
    assert stored.timings.total_s is not None and stored.timings.queued_s is not None
    assert h.status().finish_reason is FinishReason.ERROR
    (last,) = [e.event for e in h.stream()]
    assert last == stored


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
    assert publish_token(client.redis, stale, 0, "x") is PublishCode.LEASE_LOST
    assert _finish(client.redis, client.settings, stale, "x", 1) is None
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
    assert publish_token(client.redis, c, 0, "x") is PublishCode.CANCEL_REQUESTED
    renew = Renew(TAG, {c.request_id: c.lease_token})
    reply = Scripts(client.redis).run(renew.call(client.keys, client.settings.lease_ms))
    assert renew.parse(reply) == {c.request_id: RenewCode.RENEWED}


def test_renew_extends_only_leases_still_held(client: Client) -> None:
    client.submit("a")
    client.submit("b")
    c1, c2 = claim(client.redis, client.settings, 2)
    held = {c1.request_id: c1.lease_token, c2.request_id: "someone-else:1"}
    renew = Renew(TAG, held)
    reply = Scripts(client.redis).run(renew.call(client.keys, client.settings.lease_ms))
    assert list(renew.parse(reply).values()) == [RenewCode.RENEWED, RenewCode.LEASE_LOST]


def test_one_publish_call_serves_a_whole_step_with_a_code_per_request(client: Client) -> None:
    handles = [client.submit(f"p{i}") for i in range(3)]
    claimed = claim(client.redis, client.settings, 3)
    event = dumps(TokenEvent(index=0, token_ids=(7,), text="x"))
    items = [TokenPublish(c.request_id, c.lease_token, event, 0, 1) for c in claimed]
    items[1] = TokenPublish(claimed[1].request_id, "stale:1", event, 0, 1)
    items.append(TokenPublish(claimed[2].request_id, claimed[2].lease_token, event, 5, 1))
    # One call for the step on one Redis; one per request on a cluster (one slot each).
    publish = Publish(items)
    calls = publish.calls(Keys(), client.settings.result_ttl_s, cluster=is_cluster(client.redis))
    codes = [w.code for w in publish.parse([Scripts(client.redis).run(call) for call in calls])]
    assert codes == [
        PublishCode.PUBLISHED,
        PublishCode.LEASE_LOST,
        PublishCode.PUBLISHED,
        PublishCode.GAP,
    ]
    by_id = {h.id: h for h in handles}
    assert [by_id[c.request_id].status().num_generated for c in claimed] == [1, 0, 1]


def test_a_request_written_by_hand_without_fields_still_has_a_readable_status(
    client: Client,
) -> None:
    rid = client.handle(f"{TAG}-{'a' * 24}").id
    client.redis.hset(Keys().request(rid), mapping={"state": "dead"})
    status = client.handle(rid).status()
    assert (status.state, status.priority, status.model) == (RequestState.DEAD, 0, "")


def _final_alone(c: Claimed, num_published: int | None) -> Finish:
    final = FinalEvent(finish_reason=FinishReason.LENGTH)
    return Finish(c.request_id, c.lease_token, final, b'{"text":"","token_ids":[]}',
                  Fate.FINISHED, num_published)  # fmt: skip


def test_a_final_is_written_only_once_the_stream_holds_every_token_counted(
    client: Client,
) -> None:
    """A failover may leave the new primary without the stream's last entries: the
    worker's final, counting them, waits until they are written again."""
    h = client.submit("hi")
    (c,) = claim(client.redis, client.settings, 1)
    publish_token(client.redis, c, 0, "a")
    scripts, ttl_s = Scripts(client.redis), client.settings.result_ttl_s
    early = _final_alone(c, 2)  # the worker counts two tokens; the stream holds one
    assert early.parse(scripts.run(early.call(Keys(), ttl_s))) is None
    assert h.status().state is RequestState.RUNNING
    assert publish_token(client.redis, c, 1, "b") is PublishCode.PUBLISHED
    assert early.parse(scripts.run(early.call(Keys(), ttl_s))) is not None
    assert [e.event.type for e in h.stream()] == ["token", "token", "final"]


def test_a_final_sent_again_after_it_went_through_answers_the_same(client: Client) -> None:
    client.submit("hi")
    (c,) = claim(client.redis, client.settings, 1)
    scripts, ttl_s = Scripts(client.redis), client.settings.result_ttl_s
    final = _final_alone(c, 0)
    first = final.parse(scripts.run(final.call(Keys(), ttl_s)))
    again = final.parse(scripts.run(final.call(Keys(), ttl_s)))  # its reply was lost
    assert first is not None and again == first
    stale = _final_alone(Claimed(c.request_id, "w9:99", "", 1, 0), 0)
    assert stale.parse(scripts.run(stale.call(Keys(), ttl_s))) is None  # not its lease


def test_settling_a_withdrawn_request_drops_its_queue_entry(client: Client) -> None:
    h = client.submit("hi")
    client.redis.delete(Keys().request(h.id))  # withdrawn: its hash is gone
    Scripts(client.redis).run(Settle(TAG, [Moved(h.id, "", Fate.MISSING)]).call(Keys()))
    assert client.redis.zscore(Keys().queue(TAG), h.id) is None


def test_a_script_carries_only_the_library_functions_it_calls() -> None:
    publish, withdraw = load_source("publish"), load_source("withdraw")
    assert "local function finalize" in publish and "local function now_ms" in publish
    assert "local function fair_charge" not in publish
    assert "local function" not in withdraw


def test_a_final_written_with_its_first_tokens_times_them(client: Client) -> None:
    """One publish call carrying a request's first tokens and its final: the hash gets
    the count and first-token time, and the final's timings see them."""
    h = client.submit("hi")
    (c,) = claim(client.redis, client.settings, 1)
    event = dumps(TokenEvent(index=0, token_ids=(3, 4), text="ok"))
    output = b'{"text": "ok", "token_ids": [3, 4]}'
    final = Final.of(FinalEvent(finish_reason=FinishReason.STOP), output, Fate.FINISHED)
    publish = Publish([TokenPublish(c.request_id, c.lease_token, event, 0, 2, final)])
    (call,) = publish.calls(Keys(), client.settings.result_ttl_s, cluster=True)
    (written,) = publish.parse([Scripts(client.redis).run(call)])
    assert written.code is PublishCode.FINISHED and written.finished is not None
    timings = FinalEvent.model_validate_json(written.finished.final_json).timings
    assert None not in (timings.queued_s, timings.ttft_s, timings.total_s)
    status = h.status()
    assert (status.num_generated, status.state) == (2, RequestState.FINISHED)
    assert client.redis.hget(Keys().request(h.id), "first_token_ms") is not None


def test_settling_a_finished_request_drops_its_lease_and_deadline(client: Client) -> None:
    h = client.submit("hi")
    client.redis.zadd(Keys().deadlines(TAG), {h.id: int(time.time() * 1000) + 60_000})
    (c,) = claim(client.redis, client.settings, 1)
    assert _finish(client.redis, client.settings, c, "", 0) is not None
    r = client.redis
    assert r.zscore(Keys().leases(TAG), h.id) is None
    assert r.hget(Keys().owners(TAG), h.id) is None
    assert r.zscore(Keys().deadlines(TAG), h.id) is None
    assert r.zscore(Keys().queue(TAG), h.id) is None
