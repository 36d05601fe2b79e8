"""``python -m tests.integration.busy_worker worker ...``: `tokenq worker` on a simulated
model whose engine step, once the file ``$BUSY_TRIGGER`` appears, holds the GIL for
``$BUSY_S`` seconds (then writes ``$BUSY_TRIGGER.done``).

Held as C code that never releases it holds it: a pure-Python busy loop under a switch
interval longer than the loop (CPython hands the GIL to a waiting thread only once the
interval has passed), so no other thread of the worker runs meanwhile, whatever the
machine's speed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from producer.cli import main as cli
from worker.engine.outputs import RequestOutput
from worker.sim import SimEngine


def hold_gil(seconds: float) -> None:
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds * 10)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    finally:
        sys.setswitchinterval(before)


def busy_steps(trigger: Path, seconds: float) -> None:
    step = SimEngine.step

    def busy_step(self: SimEngine) -> list[RequestOutput]:
        if trigger.exists():
            trigger.unlink()
            hold_gil(seconds)
            trigger.with_suffix(".done").touch()
        return step(self)

    SimEngine.step = busy_step  # type: ignore[method-assign]


if __name__ == "__main__":
    busy_steps(Path(os.environ["BUSY_TRIGGER"]), float(os.environ["BUSY_S"]))
    cli()
