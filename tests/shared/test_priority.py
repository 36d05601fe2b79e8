import pytest

from shared.priority import MAX_PRIORITY, MIN_PRIORITY, Priority, parse_priority, priority_name


@pytest.mark.parametrize(
    ("value", "expected"),
    [("low", 25), ("NORMAL", 50), ("high", 75), ("critical", 100), (0, 0), (100, 100), ("42", 42)],
)
def test_parse_accepts_names_and_integers(value: object, expected: int) -> None:
    assert parse_priority(value) == expected


def test_named_levels_are_ordered() -> None:
    assert Priority.LOW < Priority.NORMAL < Priority.HIGH < Priority.CRITICAL
    assert MIN_PRIORITY <= Priority.LOW and Priority.CRITICAL <= MAX_PRIORITY


@pytest.mark.parametrize("value", ["urgent", -1, 101, 2.5, True, None, "1e3"])
def test_parse_rejects_with_a_clear_message(value: object) -> None:
    with pytest.raises(ValueError, match="priority"):
        parse_priority(value)


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="low, normal, high, critical"):
        parse_priority("urgent")


def test_priority_name() -> None:
    assert priority_name(75) == "high"
    assert priority_name(60) == "60"
