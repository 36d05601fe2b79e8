"""Several real processes for one test, each logging to its own file."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

STOP_S = 60
LOG_TAIL_CHARS = 4000


@contextmanager
def started(commands: dict[str, list[str]], env: dict[str, str], log_dir: Path) -> Iterator[None]:
    """Each command as a process logging to ``log_dir/<name>.log``, all terminated (and
    waited for) when the block ends. One that outlives ``STOP_S`` after SIGTERM is
    killed, and the test fails with the end of its log."""
    with ExitStack() as stack:
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for name, cmd in commands.items():
            log = stack.enter_context((log_dir / f"{name}.log").open("wb"))
            procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield
        finally:
            for proc in procs.values():
                proc.terminate()
            held = [name for name, proc in procs.items() if not _stopped(proc)]
            if held:
                tails = "\n".join(f"--- {name}.log ---\n{_tail(log_dir, name)}" for name in held)
                raise AssertionError(f"still running {STOP_S}s after SIGTERM: {held}\n{tails}")


def _stopped(proc: subprocess.Popen[bytes]) -> bool:
    try:
        proc.wait(timeout=STOP_S)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def _tail(log_dir: Path, name: str) -> str:
    return (log_dir / f"{name}.log").read_text(errors="replace")[-LOG_TAIL_CHARS:]
