"""Asynchronous scheduling: the host never makes the device wait.

While step N runs, the host schedules step N+1, builds its inputs and reads step
N-1's tokens (detokenize, stop strings, outputs). Steps run in launch order, so step
N+1 takes step N's sampled ids straight from the device: on CUDA (and the timed
forward) the host thread queues each step on the stream, which then runs it by itself;
the CPU's forward computes on one executor thread meanwhile. Step N+1's
``PENDING`` tokens (``StepInputs.pending_index``) are filled there from them. The
host reads step N's ids one step later, from a copy that it waits for on its own
(one device-to-host copy per step, never a synchronisation of the whole device).

A sequence found finished one step late has had one more token computed in the
step already launched: the engine drops it, so it is never published nor counted.

``timed_forward_token_ids`` and ``TimedDevice`` are the CPU's stand-in for a device:
a forward of a fixed duration that does not hold the GIL, whose ids depend on each
row's last token and position only (``EngineConfig.timed_forward_ms``). As on a
device's stream, a step queued while the one before runs starts when that one ends,
and the host waits for a step's end only when it reads the step.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from worker.engine import prompt_logprobs
from worker.engine.outputs import RunnerOutput, SchedulerOutput
from worker.engine.sampler import SamplingRow, unpack

_MIX_TOKEN = 0x9E3779B1
_MIX_POS = 0x85EBCA77


@dataclass
class StepResult:
    """A step's sampled ids on the device, and what the host reads of them once the
    copy is done (``ready``)."""

    token_ids: torch.Tensor
    packed: torch.Tensor
    pooled: list[list[float]] = field(default_factory=list)
    ready: Any = None  # a CUDA event, where the copy is asynchronous
    errors: dict[int, str] = field(default_factory=dict)  # rows that failed (their own part)
    # Prompt logprobs: the packed scores on the host, and each scoring row's span.
    prompt_packed: torch.Tensor | None = None
    prompt_spans: list[tuple[int, int]] = field(default_factory=list)

    def runner_output(self, rows: list[SamplingRow]) -> RunnerOutput:
        if self.ready is not None:
            self.ready.synchronize()  # this step's copy only, not the steps queued after
        token_ids, logprobs = unpack(self.packed, rows)
        prompt: list[list[dict[str, Any]]] = [
            [] for _ in self.prompt_spans
        ]  # the timed forward's: none
        if self.prompt_packed is not None:
            prompt = prompt_logprobs.unpack(self.prompt_packed, self.prompt_spans)
        return RunnerOutput(token_ids, logprobs, self.pooled, self.errors, prompt)


@dataclass
class InFlight:
    """A launched step: what the scheduler decided, its sampling rows, where each
    sampled sequence's pending token sits, and the executor's result to come."""

    sched_out: SchedulerOutput
    rows: list[SamplingRow]
    future: Future[StepResult]
    # Where each sampled sequence's pending token sits (``Scheduler.advance``).
    token_index: list[int] = field(default_factory=list)

    def result(self) -> RunnerOutput:
        return self.future.result().runner_output(self.rows)


@dataclass
class Verified:
    """A step run to its end as it was launched: a speculative step, whose drafts are
    verified before the next step is scheduled (it is read at once, never in flight)."""

    sched_out: SchedulerOutput
    output: RunnerOutput
    token_index: list[int] = field(default_factory=list)

    def result(self) -> RunnerOutput:
        return self.output


class TimedDevice:
    """The timed forward's stream: each step runs ``step_s``, from when it is queued
    or, if later, when the step before it ends."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self._free_at = 0.0

    def run(self) -> StepEnd:
        start = max(time.perf_counter(), self._free_at)
        self._free_at = start + self.step_s
        return StepEnd(self._free_at)


@dataclass
class StepEnd:
    """A timed step's end, as a CUDA event's: ``synchronize`` waits for it (GIL free)."""

    at: float

    def synchronize(self) -> None:
        delay_s = self.at - time.perf_counter()
        if delay_s > 0:
            time.sleep(delay_s)


def to_host(packed: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """``packed`` as float64 on the host: on CUDA a copy into pinned memory behind an
    event, that the host waits for when it reads it."""
    if packed.device.type != "cuda":
        return packed.double(), None
    host = torch.empty(packed.shape, dtype=torch.float64, pin_memory=True)
    host.copy_(packed.double(), non_blocking=True)
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()
    return host, event


def timed_forward_token_ids(
    token_ids: torch.Tensor, positions: torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """The timed forward's next token for each sampling row: a hash of its last token
    and that token's position, within the vocabulary."""
    z = (token_ids + 1) * _MIX_TOKEN + (positions + 1) * _MIX_POS
    z = z ^ (z >> 13)
    z = z * 0x5BD1E995
    z = z ^ (z >> 15)
    return torch.remainder(z, vocab_size)


def timed_pack(token_ids: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """What ``Sampler.sample`` packs, for the timed forward's ids: the model's logprob of
    each is taken as 0 (certain), with the id itself as every top entry."""
    num_top = max((r.params.logprobs or 0 for r in rows), default=0)
    wants_logprobs = any(r.params.logprobs is not None for r in rows)
    ids = token_ids[:, None].double()
    if not wants_logprobs:
        return ids
    zeros = torch.zeros_like(ids)
    return torch.cat([ids, zeros, ids.expand(-1, num_top), zeros.expand(-1, num_top)], dim=1)
