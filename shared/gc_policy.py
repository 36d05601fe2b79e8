"""Garbage collection for long-lived serving processes (gateway, worker).

Python's cyclic collector now and then walks every tracked object at once: in a worker
with torch and transformers loaded, or a gateway holding many streams, that pause is
long enough for every token in flight to wait on it (docs/benchmarks.md has the
figures). Nearly all of those objects are made at start-up (modules, the model, the app
and its schemas) and live as long as the process, so they are frozen out of the
collector's view; and young collections, which promote whatever is in flight at the
moment to the older generations, are made rarer, so that full collections are rare and
short.

Frozen objects are given back to the collector at exit: the interpreter's teardown
never collects the permanent generation, and an extension built with nanobind (triton,
which transformers imports where it is installed) then reports each object it still
holds as "leaked" (some 40 lines on stderr as a worker exits).
"""

from __future__ import annotations

import atexit
import gc

# Container allocations between young collections (CPython's default, 700, ran one
# every few milliseconds in a busy gateway).
YOUNG_THRESHOLD = 100_000


def freeze_startup_objects() -> None:
    """Call once start-up is done, before serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 50, 100)
    atexit.register(gc.unfreeze)
