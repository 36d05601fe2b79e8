"""Several real processes for one test, each logging to its own file."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path


@contextmanager
def started(commands: dict[str, list[str]], env: dict[str, str], log_dir: Path) -> Iterator[None]:
    """Each command as a process logging to ``log_dir/<name>.log``, all terminated (and
    waited for) when the block ends."""
    with ExitStack() as stack:
        procs = []
        for name, cmd in commands.items():
            log = stack.enter_context((log_dir / f"{name}.log").open("wb"))
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        try:
            yield
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=60)
