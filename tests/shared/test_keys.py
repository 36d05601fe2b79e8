import random

import pytest
from redis.crc import key_slot

from shared.errors import InvalidRequest
from shared.keys import (
    NUM_SLOTS,
    REQUEST_SLOTS,
    Keys,
    idempotency_digest,
    idempotency_tag,
    model_tag,
    new_request_id,
    request_tag,
    slot_tag,
    tag_of,
)


def test_model_keys_share_the_model_tag_and_request_keys_their_own() -> None:
    keys = Keys("ns")
    rid = new_request_id("my-model")
    tag = model_tag("my-model")
    for key in (keys.queue(tag), keys.leases(tag), keys.owners(tag), keys.dead(tag)):
        assert key.startswith(f"ns:{{{tag}}}:")
    for key in (keys.request(rid), keys.stream(rid)):
        assert key.startswith(f"ns:{{{request_tag(rid)}}}:")
    assert tag_of(rid) == tag


def test_an_idempotent_request_shares_the_slot_of_its_key() -> None:
    digest = idempotency_digest("m", "order-17", "acme")
    rid = new_request_id("m", idempotency_tag(digest))
    keys = Keys()
    assert key_slot(keys.idempotency(digest).encode()) == key_slot(keys.request(rid).encode())
    assert key_slot(keys.idempotency(digest).encode()) in REQUEST_SLOTS
    assert idempotency_digest("m", "order-17", "beta") != digest


def test_requests_of_one_model_spread_evenly_over_a_bounded_set_of_slots() -> None:
    keys = Keys()
    slots = [key_slot(keys.stream(new_request_id("m")).encode()) for _ in range(3000)]
    assert set(slots) == set(REQUEST_SLOTS)  # every one used, no other
    # Three masters own a third of the slot range each: each gets a third of the requests.
    thirds = [sum(s * 3 // NUM_SLOTS == m for s in slots) / len(slots) for m in range(3)]
    assert all(0.28 < t < 0.39 for t in thirds), thirds


def test_a_tag_can_be_made_for_every_slot() -> None:
    rng = random.Random(7)
    for slot in range(NUM_SLOTS):
        head = f"{rng.getrandbits(44):011x}"
        tag = slot_tag(head, slot)
        assert tag.startswith(head) and len(tag) == 16 and int(tag, 16) >= 0
        assert key_slot(f"x:{{{tag}}}:y".encode()) == slot


def test_namespaces_keep_deployments_apart() -> None:
    rid = new_request_id("m")
    assert Keys("a").request(rid) != Keys("b").request(rid)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "x",
        "../../etc",
        "0123abcd-zz",
        "0123abcd-" + "0" * 23,
        "0123abcd-" + "0" * 25,
        "tokenq:*",
        "a b",
    ],
)
def test_malformed_ids_never_become_keys(bad: str) -> None:
    with pytest.raises(InvalidRequest, match="malformed request id"):
        Keys().request(bad)


def test_ids_are_unique_and_carry_their_tag() -> None:
    ids = {new_request_id("m") for _ in range(1000)}
    assert len(ids) == 1000
    assert {tag_of(i) for i in ids} == {model_tag("m")}
