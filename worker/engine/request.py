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
    # Its cache salt (shared.cache_scope): only requests with the same one share cached
    # blocks; empty for requests of the common cache.
    cache_salt: bytes = b""
    # Its prefix fingerprints (shared/prefixes.py), each with the number of prompt tokens
    # its cut renders to: the KV cache says which it holds warm (``warm_fingerprints``).
    prefix_cuts: tuple[tuple[str, int], ...] = ()

    # Resumed mid-answer after its worker died: its client is waiting for the rest.
    resumed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.resumed = bool(self.output_token_ids)

    @property
    def embed(self) -> bool:
        return self.task == "embed"


# A token id sampled on the device that the host has not read yet.
PENDING = -1


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Scheduler state of one request: its tokens, how many have KV, where they live.

    ``block_table`` lists the KV cache blocks that hold its tokens, in order; the
    first ``num_cached_blocks`` of them are full and findable by later requests. A
    hybrid model's running sequence also holds a ``state_slot`` for its recurrent and
    convolution layers' state.
    """

    request: EngineRequest
    seq_no: int
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    state_slot: int | None = None
    block_digests: list[bytes] = field(default_factory=list, repr=False)
    # Its prefix-cache lookups (one per admission, again after a preemption): tokens
    # looked up, and of those found cached; summed per tenant by the worker.
    num_prefix_queried_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    boost: int = 0
    finish_reason: FinishReason | None = None
    # Asynchronous scheduling (``worker.engine.overlap``): the last tokens are
    # ``PENDING`` placeholders while the steps that sample them run; the newest one is
    # row ``pending_row`` of its step's sampled ids on the device.
    num_pending_tokens: int = 0
    pending_row: int = 0
    # ``__lt__``'s order as a key, kept (``raise_boost`` changes it): a sort reads it for
    # every waiting sequence every step.
    sort_key: tuple[int, float, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.raise_boost(self.boost)

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
    def waits_for_token(self) -> bool:
        """Whether its next step must wait for the host to read its last token: a
        grammar's matcher and the penalties read it on the host, and a sequence at its
        token budget finishes with it."""
        if not self.num_pending_tokens:
            return False
        params = self.request.sampling
        return (
            self.request.grammar is not None
            or self.num_output_tokens >= params.max_tokens
            or params.repetition_penalty != 1.0
            or bool(params.presence_penalty or params.frequency_penalty)
        )

    def drop_pending(self) -> None:
        """Forget the tokens still in flight (it finished before they were read)."""
        if self.num_pending_tokens:
            del self.token_ids[-self.num_pending_tokens :]
            self.num_pending_tokens = 0

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def __lt__(self, other: Sequence) -> bool:
        """The one priority order: more urgent first, then earlier arrival, then add order.

        Scheduling takes the smallest first; the preemption victim is the largest.
        """
        return self.sort_key < other.sort_key

    def raise_boost(self, boost: int) -> None:
        """Aging: ``boost`` more priority points than its request's own."""
        self.boost = boost
        self.sort_key = (-self.priority, self.request.arrival, self.seq_no)
