"""Several real processes for one test, each logging to its own file."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

STOP_S = 60
CLEAN_EXITS = (0, -signal.SIGTERM)  # drained and returned, or stopped by the signal
LOG_TAIL_CHARS = 4000


@contextmanager
def started(commands: dict[str, list[str]], env: dict[str, str], log_dir: Path) -> Iterator[None]:
    """Each command as a process logging to ``log_dir/<name>.log``, all terminated (and
    waited for) when the block ends. Unless the block itself failed, one that did not
    stop cleanly (still running ``STOP_S`` after SIGTERM, so killed, or ended with
    another status, such as a forced stop's 1) fails the test with the end of its log."""
    with ExitStack() as stack:
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for name, cmd in commands.items():
            log = stack.enter_context((log_dir / f"{name}.log").open("wb"))
            procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield
        except BaseException:
            _stop(procs)
            raise
        unclean = _stop(procs)
        if unclean:
            tails = "\n".join(
                f"--- {name}.log ({how}) ---\n{_tail(log_dir, name)}" for name, how in unclean
            )
            raise AssertionError(f"did not stop cleanly on SIGTERM:\n{tails}")


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> list[tuple[str, str]]:
    """Terminate every process and wait; those that did not stop cleanly, and how."""
    for proc in procs.values():
        proc.terminate()
    unclean = []
    for name, proc in procs.items():
        try:
            code = proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            unclean.append((name, f"still running {STOP_S}s after SIGTERM: killed"))
            continue
        if code not in CLEAN_EXITS:
            unclean.append((name, f"exit status {code}"))
    return unclean


def _tail(log_dir: Path, name: str) -> str:
    return (log_dir / f"{name}.log").read_text(errors="replace")[-LOG_TAIL_CHARS:]
