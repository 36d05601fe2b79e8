import pytest

from shared.errors import InvalidRequest
from shared.keys import Keys, model_tag, new_request_id, tag_of


def test_request_keys_share_the_model_hash_tag() -> None:
    keys = Keys("ns")
    rid = new_request_id("my-model")
    tag = model_tag("my-model")
    for key in (keys.request(rid), keys.stream(rid), keys.queue(tag), keys.leases(tag)):
        assert key.startswith(f"ns:{{{tag}}}:")


def test_namespaces_keep_deployments_apart() -> None:
    rid = new_request_id("m")
    assert Keys("a").request(rid) != Keys("b").request(rid)


@pytest.mark.parametrize(
    "bad", ["", "x", "../../etc", "0123abcd-zz", "0123abcd-" + "0" * 23, "tokenq:*", "a b"]
)
def test_malformed_ids_never_become_keys(bad: str) -> None:
    with pytest.raises(InvalidRequest, match="malformed request id"):
        Keys().request(bad)


def test_ids_are_unique_and_carry_their_tag() -> None:
    ids = {new_request_id("m") for _ in range(1000)}
    assert len(ids) == 1000
    assert {tag_of(i) for i in ids} == {model_tag("m")}
