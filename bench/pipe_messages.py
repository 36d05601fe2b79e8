"""The engine process's pipe: a step's outputs sent as typed ``RequestOutput``s (what
``worker.engine_messages.Stepped`` carries) against the bare tuples of their fields
that crossed before, over a real ``multiprocessing`` pipe, alternated in one run.

    python bench/pipe_messages.py                 # 64 rows a step, 2000 steps, 15 rounds
    python bench/pipe_messages.py --rows 1 --steps 20000

Each figure is microseconds per step for send, receive and rebuilding the outputs on
the worker's side, the fastest round of each; the ratio is typed over tuples (1.0 or
less: as fast).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from operator import attrgetter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.engine.outputs import RequestOutput
from worker.engine_messages import Stepped

AS_TUPLE = attrgetter(*(f.name for f in fields(RequestOutput)))
STATS = {"running": 64.0, "waiting": 3.0, "kv_cache_usage": 0.4}


def outputs(num_rows: int) -> list[RequestOutput]:
    return [
        RequestOutput(f"req-{i:05d}-{'x' * 20}", 17, [1234], " word", None, None, 120, 17)
        for i in range(num_rows)
    ]


def send_typed(conn: Connection, rows: list[RequestOutput]) -> None:
    conn.send(Stepped(rows, STATS))


def recv_typed(conn: Connection) -> list[RequestOutput]:
    stepped: Stepped = conn.recv()
    return stepped.outputs


@dataclass(frozen=True)
class TupleStepped:
    """The message as it crossed before: the outputs as bare tuples of their fields."""

    outputs: list[tuple[Any, ...]]
    stats: dict[str, float]
    warm: list[str] | None = None
    loras: list[str] | None = None


def send_tuples(conn: Connection, rows: list[RequestOutput]) -> None:
    conn.send(TupleStepped([AS_TUPLE(out) for out in rows], STATS))


def recv_tuples(conn: Connection) -> list[RequestOutput]:
    stepped: TupleStepped = conn.recv()
    return [RequestOutput(*row) for row in stepped.outputs]


def per_step_us(
    send: Callable[[Connection, list[RequestOutput]], None],
    recv: Callable[[Connection], list[RequestOutput]],
    rows: list[RequestOutput],
    num_steps: int,
) -> float:
    """Microseconds per step: each step's message sent, then read back (a step's
    message fits the pipe's buffer, so one thread does both and no thread switch or
    GIL hand-over is timed)."""
    reader, writer = Pipe(duplex=False)
    got: Any = None
    started = time.perf_counter()
    for _ in range(num_steps):
        send(writer, rows)
        got = recv(reader)
    elapsed_s = time.perf_counter() - started
    assert got == rows
    reader.close()
    writer.close()
    return elapsed_s / num_steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    rows = outputs(args.rows)
    figures: dict[str, list[float]] = {"tuples": [], "typed": []}
    for _ in range(args.rounds):
        figures["tuples"].append(per_step_us(send_tuples, recv_tuples, rows, args.steps))
        figures["typed"].append(per_step_us(send_typed, recv_typed, rows, args.steps))
    # The fastest round of each: on a busy machine the slow rounds are the neighbours'.
    tuples, typed = (min(figures[k]) for k in ("tuples", "typed"))
    print(f"{args.rows} rows a step, {args.steps} steps, fastest of {args.rounds} rounds:")
    print(f"  tuples {tuples:8.1f} us/step")
    print(f"  typed  {typed:8.1f} us/step  {typed / tuples:4.2f}x tuples")


if __name__ == "__main__":
    main()
