"""What the scheduler did that a trace shows: prefill chunks, the end of a prefill
(the step that yields the first token) and preemptions.

The engine tells its ``ScheduleEvents`` (set only while the worker traces) of each
request it takes and of each step's schedule; the worker takes the events after each
step. It is work per step, not per token: a step's rows are looked at only while a
request is prefilling (a pure decode step costs a set's emptiness check).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

from worker.engine.outputs import SchedulerOutput
from worker.engine.request import SeqStatus, Sequence


class ScheduleKind(Enum):
    CHUNK = "chunk"  # a prefill chunk was scheduled
    PREFILLED = "prefilled"  # its prompt's last chunk: the step yields its first token
    PREEMPTED = "preempted"  # its cache was freed; it is computed again from its start


@dataclass(frozen=True, slots=True)
class ScheduleEvent:
    kind: ScheduleKind
    request_id: str
    time_ns: int
    start_pos: int = 0  # a chunk's first position
    num_tokens: int = 0  # a chunk's tokens, or a preempted request's generated tokens


@dataclass
class ScheduleEvents:
    events: list[ScheduleEvent] = field(default_factory=list)
    prefilling: dict[str, Sequence] = field(default_factory=dict)

    def added(self, seq: Sequence) -> None:
        self.prefilling[seq.request_id] = seq

    def scheduled(self, out: SchedulerOutput) -> None:
        now_ns = time.time_ns()
        for seq in out.preempted:
            event = ScheduleEvent(
                ScheduleKind.PREEMPTED, seq.request_id, now_ns, 0, seq.num_output_tokens
            )
            self.events.append(event)
            self.prefilling[seq.request_id] = seq
        if not self.prefilling:
            return
        for item in out.scheduled:
            request_id = item.seq.request_id
            if request_id in self.prefilling:
                chunk = ScheduleEvent(
                    ScheduleKind.CHUNK, request_id, now_ns, item.start_pos, item.num_tokens
                )
                self.events.append(chunk)
                if item.completes_prompt:
                    del self.prefilling[request_id]
                    self.events.append(ScheduleEvent(ScheduleKind.PREFILLED, request_id, now_ns))
        for request_id, seq in list(self.prefilling.items()):
            if seq.status is SeqStatus.FINISHED:
                del self.prefilling[request_id]

    def take(self) -> list[ScheduleEvent]:
        events, self.events = self.events, []
        return events
