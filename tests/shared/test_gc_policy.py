"""A serving process's start-up objects are frozen out of the collector's view, and
given back at exit, so the process ends quietly."""

from __future__ import annotations

import subprocess
import sys

# A process that froze its start-up objects with triton loaded (as a worker does where
# transformers finds triton), then exits normally.
FROZEN_THEN_EXIT = """
import gc
import triton  # noqa: F401  (a nanobind extension: it reports what it still holds at exit)
from shared.gc_policy import freeze_startup_objects
freeze_startup_objects()
assert gc.get_freeze_count() > 0
"""


def test_a_process_that_froze_its_objects_exits_without_leak_reports() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FROZEN_THEN_EXIT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr, done.stderr
