"""Followers without Redis: who gets which entry of a read, and where the next starts."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from producer.streams.core import Followers, Subscription
from producer.streams.slots import Pacer, plan_reads


def _parse(key: str, entry_id: str, fields: Any) -> list[str]:
    if fields == "bad":
        raise ValueError(f"cannot read {entry_id}")
    return [f"{key}/{entry_id}"]


def _entries(key: str, *ids: str) -> list[tuple[str, str, str]]:
    return [(key, i, "ok") for i in ids]


def _follow(followers: Followers[str], key: str, after: str = "0-0") -> Subscription[str]:
    return followers.add(key, after, threading.Event())


def test_each_follower_gets_what_follows_its_own_cursor_once() -> None:
    followers = Followers(_parse)
    whole, late = _follow(followers, "a"), _follow(followers, "a", after="1-0")
    read_from = followers.cursors()
    followers.dispatch(_entries("a", "1-0", "2-0"), read_from)
    followers.dispatch(_entries("a", "2-0", "3-0"), read_from)  # 2-0 read twice
    assert whole.take() == ["a/1-0", "a/2-0", "a/3-0"]
    assert late.take() == ["a/2-0", "a/3-0"]
    assert followers.cursors() == {"a": "3-0"}


def test_a_follower_joining_behind_a_read_in_flight_misses_nothing() -> None:
    followers = Followers(_parse)
    ahead = _follow(followers, "a", after="5-0")
    read_from = followers.cursors()  # the read in flight starts at 5-0
    behind = _follow(followers, "a")  # joins from the start meanwhile
    followers.dispatch(_entries("a", "6-0"), read_from)
    assert (ahead.take(), behind.take()) == (["a/6-0"], [])
    assert followers.cursors() == {"a": "0-0"}  # the next read starts from it
    followers.dispatch(_entries("a", *[f"{i}-0" for i in range(1, 8)]), followers.cursors())
    assert behind.take() == [f"a/{i}-0" for i in range(1, 8)]
    assert ahead.take() == ["a/7-0"]


def test_an_unreadable_entry_fails_its_followers_only() -> None:
    followers = Followers(_parse)
    broken, fine = _follow(followers, "a"), _follow(followers, "b")
    read_from = followers.cursors()
    followers.dispatch([("a", "1-0", "bad"), ("b", "1-0", "ok")], read_from)
    with pytest.raises(ValueError, match="cannot read 1-0"):
        broken.take()
    assert fine.take() == ["b/1-0"]


def test_a_follower_that_leaves_is_no_longer_read() -> None:
    followers = Followers(_parse)
    sub = _follow(followers, "a")
    other = _follow(followers, "b")
    followers.remove(sub)
    assert followers.cursors() == {"b": "0-0"} and followers.num_subscriptions == 1
    followers.remove(other)
    assert not followers


def test_reads_are_planned_one_per_slot_and_one_pipeline_per_node() -> None:
    class Node:
        def __init__(self, name: str) -> None:
            self.name = name

    nodes = {"n1": Node("n1"), "n2": Node("n2")}
    where = {"a": ("n1", 1), "b": ("n1", 1), "c": ("n1", 2), "d": ("n2", 9)}
    node_of_slot = {slot: nodes[name] for name, slot in where.values()}
    plan = plan_reads({k: "0-0" for k in where}, node_of_slot.__getitem__, lambda k: where[k][1])
    assert {name: r.reads for name, r in plan.items()} == {
        "n1": [{"a": "0-0", "b": "0-0"}, {"c": "0-0"}],
        "n2": [{"d": "0-0"}],
    }


def test_rounds_slow_down_while_nothing_arrives_and_speed_up_when_it_does() -> None:
    pacer = Pacer(busy_s=0.01, quiet_s=0.05)
    assert [pacer.after_round(False) for _ in range(4)] == [0.02, 0.04, 0.05, 0.05]
    assert pacer.after_round(True) == 0.01


def test_a_stream_followed_before_its_request_starts_is_named_once_then_only_in_sweeps() -> None:
    followers = Followers(_parse, dormancy=True)
    _follow(followers, "queued")
    _follow(followers, "resumed", after="5-0")  # a reader mid-answer: its request runs
    assert followers.cursors(sweep=False) == {"queued": "0-0", "resumed": "5-0"}  # once
    assert followers.cursors(sweep=False) == {"resumed": "5-0"}
    assert followers.cursors(sweep=True) == {"queued": "0-0", "resumed": "5-0"}


def test_a_start_wakes_a_dormant_stream_and_one_followed_after_its_start_is_not_dormant() -> None:
    followers = Followers(_parse, dormancy=True)
    _follow(followers, "a")
    followers.cursors(sweep=False)
    assert followers.started("a") is True  # a read in flight should start over
    assert followers.started("a") is False
    assert followers.started("b") is False  # not followed (yet)
    _follow(followers, "b")
    assert followers.cursors(sweep=False) == {"a": "0-0", "b": "0-0"}
    assert followers.cursors(sweep=False) == {"a": "0-0", "b": "0-0"}


def test_a_dormant_stream_that_a_sweep_finds_entries_in_stays_named() -> None:
    followers = Followers(_parse, dormancy=True)
    sub = _follow(followers, "a")
    followers.cursors(sweep=False)
    read_from = followers.cursors(sweep=True)
    followers.dispatch(_entries("a", "1-0"), read_from)  # its start was never announced
    assert sub.take() == ["a/1-0"]
    assert followers.cursors(sweep=False) == {"a": "1-0"}


def test_without_dormancy_every_stream_is_named_in_every_read() -> None:
    followers = Followers(_parse)
    _follow(followers, "a")
    followers.cursors(sweep=False)
    assert followers.cursors(sweep=False) == {"a": "0-0"}
