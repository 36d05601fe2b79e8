"""Request priority: named levels and the integers behind them.

Priorities are integers from ``MIN_PRIORITY`` (0) to ``MAX_PRIORITY`` (100);
higher is more urgent. The named levels sit at fixed points of that range, so
integers between them give finer control (``low < 30 < normal``).
"""

from enum import IntEnum

MIN_PRIORITY = 0
MAX_PRIORITY = 100


class Priority(IntEnum):
    LOW = 25
    NORMAL = 50
    HIGH = 75
    CRITICAL = 100


def parse_priority(value: object) -> int:
    """Turn a level name or an integer into a priority, or raise ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"priority must be a level name or an integer, not {value!r}")
    if isinstance(value, str):
        return _parse_name(value)
    if isinstance(value, int):
        return _check_range(value)
    raise ValueError(f"priority must be a level name or an integer, not {value!r}")


def priority_name(value: int) -> str:
    """The level name for ``value`` when it is one, else the integer as text."""
    try:
        return Priority(value).name.lower()
    except ValueError:
        return str(value)


def _parse_name(value: str) -> int:
    text = value.strip()
    if text.lstrip("-").isdigit():
        return _check_range(int(text))
    try:
        return int(Priority[text.upper()])
    except KeyError:
        names = ", ".join(p.name.lower() for p in Priority)
        raise ValueError(f"unknown priority {value!r}: use one of {names} or an integer") from None


def _check_range(value: int) -> int:
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"priority {value} is out of range {MIN_PRIORITY}..{MAX_PRIORITY}")
    return value


# Queue scores, lowest first. Work put back after its worker died (or stopped) comes
# before all new work: it was admitted at its priority already and its stream has a
# reader waiting mid-answer, while new work has shown nobody anything yet. Within each
# of the two regions, one band of SCORE_BAND per priority, the highest priority lowest,
# and arrival order (``seq``) within a band. Always an exact integer below 2**53, so a
# double holds it. The Lua scripts get these numbers from here
# (``shared.scripts.load_source``), and the dashboard reads bands with them.
SCORE_BAND = 2**45
FRESH_OFFSET = (MAX_PRIORITY - MIN_PRIORITY + 1) * SCORE_BAND


def queue_score(priority: int, seq: int, *, resumed: bool = False) -> int:
    """The queue score of a request of ``priority`` at ``seq`` in its band. Since tenants
    share a band fairly, ``seq`` is the request's virtual start time there (see
    shared.fairness), not an arrival number; one tenant's requests keep their order."""
    return (0 if resumed else FRESH_OFFSET) + (MAX_PRIORITY - priority) * SCORE_BAND + seq


def lua_constants() -> str:
    """The same numbers as Lua locals, for the scripts' shared library."""
    return (
        f"local MAX_PRIORITY = {MAX_PRIORITY}\n"
        f"local SCORE_BAND = {SCORE_BAND}\n"
        f"local FRESH_OFFSET = {FRESH_OFFSET}\n"
    )
