"""A request as the engine sees it, and the scheduler's per-request state."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.models import FinishReason, SamplingParams, Task

if TYPE_CHECKING:
    from worker.engine.grammar import GrammarState


@dataclass(frozen=True)
class LoraRef:
    """The LoRA adapter a request runs with: its registered name and where it is."""

    name: str
    path: str

    @property
    def cache_salt(self) -> bytes:
        """What sets its KV apart: the same tokens under two adapters differ."""
        return f"lora\x00{self.name}\x00{self.path}".encode()


@dataclass
class EngineRequest:
    """One generation request handed to :meth:`Engine.add_request`.

    ``output_token_ids`` resumes a request: tokens an earlier worker generated and
    published; generation continues right after them.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    priority: int = 50
    arrival: float = 0.0
    output_token_ids: list[int] = field(default_factory=list)
    deadline_unix_s: float | None = None
    # RESUME: the text clients already received for output_token_ids (None: all of it).
    output_text: str | None = None
    # Set by the engine for guided requests: the matcher, replayed over output_token_ids.
    grammar: GrammarState | None = None
    # "embed": prefill only, finished with the prompt's pooled hidden state; ``dimensions``
    # keeps that many of its first dimensions (then normalised again).
    task: Task = "generate"
    dimensions: int | None = None
    lora: LoraRef | None = None

    # Resumed mid-answer after its worker died: its client is waiting for the rest.
    resumed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.resumed = bool(self.output_token_ids)

    @property
    def embed(self) -> bool:
        return self.task == "embed"


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Scheduler state of one request: its tokens, how many have KV, where they live.

    ``block_table`` lists the KV cache blocks that hold its tokens, in order; the
    first ``num_cached_blocks`` of them are full and findable by later requests.
    """

    request: EngineRequest
    seq_no: int
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    block_digests: list[bytes] = field(default_factory=list, repr=False)
    boost: int = 0
    finish_reason: FinishReason | None = None

    @classmethod
    def from_request(cls, request: EngineRequest, seq_no: int) -> Sequence:
        tokens = [*request.prompt_token_ids, *request.output_token_ids]
        return cls(request, seq_no, tokens, len(request.prompt_token_ids))

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def sampling(self) -> SamplingParams:
        return self.request.sampling

    @property
    def priority(self) -> int:
        return self.request.priority + self.boost

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def __lt__(self, other: Sequence) -> bool:
        """The one priority order: more urgent first, then earlier arrival, then add order.

        Scheduling takes the smallest first; the preemption victim is the largest.
        """
        return (-self.priority, self.request.arrival, self.seq_no) < (
            -other.priority,
            other.request.arrival,
            other.seq_no,
        )
