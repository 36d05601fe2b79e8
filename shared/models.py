"""The wire schema: one set of pydantic models for everything that crosses Redis."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from shared.guided import UnsupportedSchema, check_json_schema
from shared.priority import Priority, parse_priority
from shared.refusal import Refusal
from shared.tracing import check_traceparent

# 2: the tenant and its weight are fields of a request (``GenerationRequest.tenant``);
# version 1 carried them as metadata items, and is still read (``_from_version_1``).
SCHEMA_VERSION = 2
MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20
# Prompt logprobs (scoring a prompt): the most alternatives a prompt position lists, and
# the most prompt tokens a request may ask them for (each is a stored entry of the final).
MAX_PROMPT_LOGPROBS = 20
MAX_PROMPT_LOGPROBS_TOKENS = 8192
MAX_METADATA_ITEMS = 32
MAX_LOGIT_BIAS_ITEMS = 300
MAX_GUIDED_JSON_BYTES = 64_000
MAX_GUIDED_REGEX_CHARS = 4_000
MAX_N = 16
# Bounds that hold whatever the model: no vocabulary is this large (a model's own is
# registered by its workers, shared.limits), and no context this long.
MAX_VOCAB_SIZE = 1 << 24
MAX_MAX_TOKENS = 1_000_000
# The least temperature above 0 (greedy): logits divided by it stay finite in float32
# (|logit| <= ~1e3 with logit_bias, / 1e-3 = 1e6), and below it sampling is greedy in
# all but name.
MIN_TEMPERATURE = 1e-3
MIN_REPETITION_PENALTY = 1e-2  # positive logits are divided by it
TokenId = Annotated[int, Field(ge=0, lt=MAX_VOCAB_SIZE)]
MAX_EMBEDDING_DIMENSIONS = 65_536
MAX_PROMPT_TOKEN_IDS = 1_000_000
# A token-id prompt counts as this many characters a token (the usual English estimate),
# so TOKENQ_MAX_PROMPT_CHARS and the up-front token estimates bound it as they bound text.
CHARS_PER_TOKEN_ID = 4
MAX_TOOLS = 128
MAX_TOOLS_JSON_BYTES = 256_000
MAX_TEMPLATE_KWARGS = 16
# apply_chat_template's own arguments, which chat_template_kwargs may not set.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
# A LoRA adapter's name: no ':' (the OpenAI routes read ``model: "base:adapter"``) or '/'.
LORA_NAME_PATTERN = r"^[A-Za-z0-9][\w.\-]{0,63}$"
MAX_LORA_RANK = 4096
# A request's cache salt (vLLM's ``cache_salt``, shared.cache_scope): printable text.
MAX_CACHE_SALT_CHARS = 256
# What a request asks of the model: generated tokens, or the prompt's pooled hidden
# state (an embedding; prefill only, no sampling); or of its tokenizer alone, answered
# by the worker at admission without the model: the prompt (a text, or messages through
# the chat template) as token ids, or token ids as text.
Task = Literal["generate", "embed", "tokenize", "detokenize"]
# The names of a request's tenant and its weight: its fields, the request hash's field
# (``tenant``), and the metadata items that carried them in schema version 1.
TENANT = "tenant"
TENANT_WEIGHT = "tenant_weight"
MIN_WEIGHT = 0.01
MAX_WEIGHT = 1000.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingParams(_Strict):
    """How to pick tokens. ``temperature == 0`` is greedy and deterministic. Every
    number is bounded here; what depends on the model (token ids within its vocabulary,
    prompt and max_tokens within its context) is checked against the limits its
    workers register (``shared.limits``), at submit and again by the worker."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # Before max_tokens, whose check reads it.
    prompt_logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_PROMPT_LOGPROBS,
        description="each prompt token's logprob and this many top alternatives (the first"
        " token's is null); the final event carries them",
    )
    max_tokens: int = Field(256, ge=0, le=MAX_MAX_TOKENS)
    min_tokens: int = Field(0, ge=0, le=MAX_MAX_TOKENS)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=MAX_VOCAB_SIZE, description="0 means no top-k cut")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="drop tokens below min_p * the top's")
    repetition_penalty: float = Field(1.0, ge=MIN_REPETITION_PENALTY, le=10.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: tuple[Annotated[str, Field(min_length=1, max_length=256)], ...] = Field(
        (), max_length=MAX_STOP_STRINGS
    )
    stop_token_ids: tuple[TokenId, ...] = Field((), max_length=64)
    ignore_eos: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    presence_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="subtracted once from every generated token's logit"
    )
    frequency_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="subtracted per occurrence among generated tokens"
    )
    logit_bias: dict[TokenId, Annotated[float, Field(ge=-100.0, le=100.0)]] = Field(
        default_factory=dict, max_length=MAX_LOGIT_BIAS_ITEMS
    )
    speculative: bool = Field(
        True,
        description="tokenq: false keeps this request out of the worker's speculative "
        "decoding (--speculative-config); its output is the same either way",
    )
    guided_json: dict[str, Any] | None = Field(
        None, description="a JSON schema the output must fit ({} or {'type': 'object'}: any)"
    )
    guided_regex: str | None = Field(
        None, min_length=1, max_length=MAX_GUIDED_REGEX_CHARS, description="a regex to match"
    )
    guided_structural_tag: dict[str, Any] | None = Field(
        None,
        description="an xgrammar structural tag ({'type': 'structural_tag', 'format': ...}): "
        "free text with constrained parts, such as a model's own tool-call format",
    )

    @field_validator("max_tokens")
    @classmethod
    def _generates(cls, max_tokens: int, info: ValidationInfo) -> int:
        if max_tokens == 0 and info.data.get("prompt_logprobs") is None:
            raise ValueError(
                "0 generates nothing, which only scoring a prompt asks for: give "
                "prompt_logprobs (or echo with logprobs on /v1/completions), or max_tokens >= 1"
            )
        return max_tokens

    @field_validator("temperature")
    @classmethod
    def _divisible(cls, temperature: float) -> float:
        if 0.0 < temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature {temperature} is too small to sample with: give 0 (greedy) "
                f"or at least {MIN_TEMPERATURE}"
            )
        return temperature

    @model_validator(mode="after")
    def _min_le_max(self) -> SamplingParams:
        if self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        guides = [name for name in GUIDES if getattr(self, name) is not None]
        if len(guides) > 1:
            raise ValueError(f"give at most one of {', '.join(GUIDES)}, not {' and '.join(guides)}")
        return self

    @field_validator("guided_json", "guided_structural_tag")
    @classmethod
    def _enforceable(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        """A schema, or a structural tag's schemas, that the grammar can enforce."""
        if schema is None:
            return None
        try:
            check_json_schema(schema)  # first: it bounds the depth, which orjson limits
            num_bytes = len(orjson.dumps(schema))
        except (UnsupportedSchema, orjson.JSONEncodeError) as e:
            raise ValueError(str(e)) from e
        if num_bytes > MAX_GUIDED_JSON_BYTES:
            raise ValueError(f"it is over {MAX_GUIDED_JSON_BYTES} bytes of JSON")
        return schema

    @property
    def guided(self) -> bool:
        return any(getattr(self, name) is not None for name in GUIDES)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# The ways to constrain decoding; a request takes at most one.
GUIDES = ("guided_json", "guided_regex", "guided_structural_tag")


# SamplingParams fields an OpenAI-style body (gateway, batch lines) carries under the
# same name; max_tokens, stop and logprobs need mapping and are handled apart.
OPENAI_PASSTHROUGH_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "min_tokens",
    "repetition_penalty",
    "seed",
    "stop_token_ids",
    "ignore_eos",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "guided_json",
    "guided_regex",
    "prompt_logprobs",
    "speculative",
)


class ToolCallSpec(_Strict):
    """An earlier assistant turn's call of a function, as a chat template renders it."""

    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any] | str = Field(description="parsed JSON, or the text as sent")


class FunctionSpec(_Strict):
    """A function the model may call, rendered by a chat template that takes tools."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-.]+$")
    description: str = Field("", max_length=100_000)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(max_length=1_000_000)
    # For a template that takes tools: an assistant turn's calls, a tool result's call.
    tool_calls: tuple[ToolCallSpec, ...] | None = Field(None, max_length=MAX_TOOLS)
    tool_call_id: str | None = Field(None, max_length=256)
    name: str | None = Field(None, max_length=256)

    def template_view(self) -> dict[str, Any]:
        """The message as chat templates read it (OpenAI's shape, arguments as objects)."""
        view: dict[str, Any] = self.model_dump(exclude_none=True, exclude={"tool_calls"})
        if self.tool_calls is not None:
            view["tool_calls"] = [
                {"id": c.id, "type": "function", "function": c.model_dump(exclude={"id"})}
                for c in self.tool_calls
            ]
        return view


# JSON integers as every reader holds them (orjson writes no wider ones).
MetadataValue = str | Annotated[int, Field(ge=-(2**63), lt=2**63)] | float | bool | None


class GenerationRequest(_Strict):
    """What a client submits. Exactly one of ``prompt``, ``prompt_token_ids`` and
    ``messages``; ``tools`` and ``chat_template_kwargs`` go with ``messages``."""

    version: int = SCHEMA_VERSION
    model: str = Field(min_length=1, max_length=200, pattern=r"^[\w.\-/:@+=,]+$")
    prompt: str | None = Field(None, min_length=1)
    prompt_token_ids: tuple[TokenId, ...] | None = Field(
        None, min_length=1, max_length=MAX_PROMPT_TOKEN_IDS, description="a prompt as token ids"
    )
    messages: tuple[ChatMessage, ...] | None = Field(None, min_length=1, max_length=1000)
    tools: tuple[FunctionSpec, ...] | None = Field(
        None,
        min_length=1,
        max_length=MAX_TOOLS,
        description="functions the chat template renders in the prompt (templates that take tools)",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None,
        max_length=MAX_TEMPLATE_KWARGS,
        description="extra variables for the chat template, e.g. {'enable_thinking': false}",
    )
    priority: int = int(Priority.NORMAL)
    sampling: SamplingParams = SamplingParams()
    deadline_ms: int | None = Field(None, ge=0, lt=2**53, description="unix time in ms")
    idempotency_key: str | None = Field(None, min_length=1, max_length=256)
    metadata: dict[str, MetadataValue] = Field(default_factory=dict, max_length=MAX_METADATA_ITEMS)
    task: Task = "generate"
    dimensions: int | None = Field(
        None, ge=1, le=MAX_EMBEDDING_DIMENSIONS, description="embed: keep this many dimensions"
    )
    lora: str | None = Field(
        None, pattern=LORA_NAME_PATTERN, description="a LoRA adapter registered for the model"
    )
    add_special_tokens: bool = Field(
        True, description="tokenize a prompt text: with the tokenizer's special tokens (BOS)"
    )
    cache_salt: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_CACHE_SALT_CHARS,
        description="only requests with the same salt (and tenant) share cached prefixes",
    )
    traceparent: str | None = Field(
        None, max_length=512, description="W3C trace context: the span its spans go under"
    )
    # Who submitted it, from the caller's API key (set by ``producer.submit`` alone, never
    # from the body or its metadata): requests, their idempotency keys, their prefix
    # caches and their batches are kept apart by it.
    tenant: str | None = Field(None, min_length=1, max_length=200, description="who submitted it")
    tenant_weight: float = Field(
        1.0, description="its tenant's share within a priority (shared.fairness)"
    )

    @model_validator(mode="before")
    @classmethod
    def _from_version_1(cls, data: Any) -> Any:
        """A payload of schema version 1 (queued by an earlier release): its tenant and
        weight from the metadata items that carried them then."""
        if not isinstance(data, dict) or data.get("version") != 1:
            return data
        metadata = dict(data.get("metadata") or {})
        moved = {name: metadata.pop(name) for name in (TENANT, TENANT_WEIGHT) if name in metadata}
        if moved.get(TENANT) in ("", None):
            moved.pop(TENANT, None)
        if moved.get(TENANT_WEIGHT) is None:
            moved.pop(TENANT_WEIGHT, None)
        return {**data, **moved, "metadata": metadata, "version": SCHEMA_VERSION}

    @field_validator("tenant_weight", mode="before")
    @classmethod
    def _tenant_weight(cls, value: object) -> float:
        return check_weight(value)

    @field_validator("traceparent")
    @classmethod
    def _traceparent(cls, value: str | None) -> str | None:
        return None if value is None else check_traceparent(value)

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: object) -> int:
        return parse_priority(value)

    @field_validator("cache_salt")
    @classmethod
    def _cache_salt(cls, salt: str | None) -> str | None:
        if salt is not None and not salt.isprintable():
            raise ValueError("it must be printable text (no control characters)")
        return salt

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = sorted(set(kwargs or ()) & RESERVED_TEMPLATE_KWARGS)
        if reserved:
            raise ValueError(f"{reserved[0]!r} is the chat template call's own; leave it out")
        if kwargs is not None and len(_json(kwargs)) > MAX_GUIDED_JSON_BYTES:
            raise ValueError(f"it is over {MAX_GUIDED_JSON_BYTES} bytes of JSON")
        return kwargs

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools: tuple[FunctionSpec, ...] | None) -> tuple[FunctionSpec, ...] | None:
        num_bytes = len(_json([t.model_dump() for t in tools or ()]))
        if num_bytes > MAX_TOOLS_JSON_BYTES:
            raise ValueError(f"the tools are over {MAX_TOOLS_JSON_BYTES} bytes of JSON")
        return tools

    @model_validator(mode="after")
    def _one_input(self) -> GenerationRequest:
        inputs = [self.prompt, self.prompt_token_ids, self.messages]
        if sum(x is not None for x in inputs) != 1:
            raise ValueError("give exactly one of prompt, prompt_token_ids and messages")
        if self.prompt is not None and not self.prompt.strip():
            raise ValueError("prompt must not be blank")
        if self.task == "embed" and self.messages is not None:
            raise ValueError("an embed request takes a prompt (the text to embed), not messages")
        if self.messages is None and (self.tools or self.chat_template_kwargs is not None):
            raise ValueError("tools and chat_template_kwargs go with messages (a chat prompt)")
        if self.dimensions is not None and self.task != "embed":
            raise ValueError("dimensions applies to embed requests only")
        if self.task == "detokenize" and self.prompt_token_ids is None:
            raise ValueError("a detokenize request takes prompt_token_ids (the ids to read)")
        if not self.add_special_tokens and (self.task != "tokenize" or self.prompt is None):
            raise ValueError("add_special_tokens: false applies to tokenizing a prompt text only")
        _check_prompt_logprobs(self)
        return self

    def prompt_chars(self) -> int:
        if self.prompt is not None:
            return len(self.prompt)
        if self.prompt_token_ids is not None:
            return len(self.prompt_token_ids) * CHARS_PER_TOKEN_ID
        return sum(len(m.content) for m in self.messages or ())


def _check_prompt_logprobs(req: GenerationRequest) -> None:
    """Prompt logprobs only for generation, and for at most MAX_PROMPT_LOGPROBS_TOKENS
    prompt tokens (a text prompt's count is the worker's to check)."""
    if req.sampling.prompt_logprobs is None:
        return
    if req.task == "embed":
        raise ValueError("prompt_logprobs applies to generate requests only")
    num_tokens = len(req.prompt_token_ids or ())
    if num_tokens > MAX_PROMPT_LOGPROBS_TOKENS:
        raise ValueError(
            f"prompt_logprobs: asked for a prompt of {num_tokens} tokens; they are given for "
            f"at most {MAX_PROMPT_LOGPROBS_TOKENS} prompt tokens a request"
        )


def _json(value: object) -> bytes:
    """``value`` as JSON; ValueError (a validation error) where orjson cannot write it
    (nested past its depth limit)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as e:
        raise ValueError(f"it cannot be written as JSON: {e}") from e


def check_weight(value: object) -> float:
    """A tenant weight, or ValueError saying what is wrong with it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{TENANT_WEIGHT} must be a number, not {value!r}")
    if not MIN_WEIGHT <= value <= MAX_WEIGHT:
        raise ValueError(f"{TENANT_WEIGHT} {value} is out of range {MIN_WEIGHT}..{MAX_WEIGHT}")
    return float(value)


class LoraAdapter(_Strict):
    """A LoRA adapter registered for a base model: a PEFT directory or a safetensors
    file, at a path every worker of the model can read."""

    name: str = Field(pattern=LORA_NAME_PATTERN)
    model: str = Field(min_length=1, max_length=200)
    path: str = Field(min_length=2, max_length=4096)
    registered_ms: int = Field(0, ge=0)
    # The largest rank of its LoRA pairs: a worker claims its requests only within its
    # --max-lora-rank. 0 in a record registered before ranks were kept (any worker
    # that serves adapters claims those).
    rank: int = Field(0, ge=0, le=MAX_LORA_RANK)

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(
                f"give an absolute path (workers resolve it on their own hosts), got {path!r}"
            )
        return path


class RequestState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    DEAD = "dead"

    @property
    def terminal(self) -> bool:
        return self not in (RequestState.QUEUED, RequestState.RUNNING)


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    EXPIRED = "expired"
    ERROR = "error"


class Usage(_Strict):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(_Strict):
    """Seconds: waiting in the queue, to the first token, and in all since submit."""

    queued_s: float | None = None
    ttft_s: float | None = None
    total_s: float | None = None


class TokenEvent(_Strict):
    type: Literal["token"] = "token"
    index: int = Field(ge=0, description="index of the first token in this event")
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[dict[str, Any], ...] | None = None
    steps: tuple[tuple[int, int], ...] | None = Field(
        None,
        description="a coalesced event (several engine steps written as one stream entry):"
        " each step's number of tokens and of text characters, in order; see split()",
    )

    @model_validator(mode="after")
    def _steps_cover_the_event(self) -> TokenEvent:
        if self.steps is not None:
            num_tokens, num_chars = (sum(s[i] for s in self.steps) for i in (0, 1))
            covered = (num_tokens, num_chars) == (len(self.token_ids), len(self.text))
            if not covered or min(min(s) for s in self.steps) < 0:
                raise ValueError(
                    f"steps {self.steps} cover {num_tokens} tokens and {num_chars} characters;"
                    f" the event has {len(self.token_ids)} and {len(self.text)}"
                )
        return self

    def split(self) -> list[TokenEvent]:
        """The engine steps a coalesced event holds, each with the index of its first
        token (itself when it holds one step)."""
        if self.steps is None:
            return [self]
        events: list[TokenEvent] = []
        first = char = 0
        for num_tokens, num_chars in self.steps:
            ids = self.token_ids[first : first + num_tokens]
            text = self.text[char : char + num_chars]
            logprobs = None if self.logprobs is None else self.logprobs[first : first + num_tokens]
            event = TokenEvent(
                index=self.index + first, token_ids=ids, text=text, logprobs=logprobs
            )
            events.append(event)
            first, char = first + num_tokens, char + num_chars
        return events

    @classmethod
    def coalesce(cls, events: Sequence[TokenEvent]) -> TokenEvent:
        """Consecutive events of one request as one (``split`` gives them back)."""
        if len(events) == 1:
            return events[0]
        pieces = [p for e in events for p in e.split()]
        has_logprobs = all(p.logprobs is not None for p in pieces)
        return cls(
            index=pieces[0].index,
            token_ids=tuple(t for p in pieces for t in p.token_ids),
            text="".join(p.text for p in pieces),
            logprobs=tuple(x for p in pieces for x in p.logprobs or ()) if has_logprobs else None,
            steps=tuple((len(p.token_ids), len(p.text)) for p in pieces),
        )

    def wire(self) -> bytes:
        """The stream entry's JSON: ``steps`` only when there are several, so readers
        from before coalescing still read every entry of a worker with it turned off."""
        return token_wire(self.index, self.token_ids, self.text, self.logprobs, self.steps)


def token_wire(
    index: int,
    token_ids: Sequence[int],
    text: str,
    logprobs: Sequence[dict[str, Any]] | None = None,
    steps: Sequence[tuple[int, int]] | None = None,
) -> bytes:
    """A token event's stream entry from its fields, as ``TokenEvent.wire`` writes it:
    the worker builds one per request per write, and a pydantic model on that path
    cost it several µs a token. The fields are the engine's own, so already valid."""
    event: dict[str, Any] = {
        "type": "token",
        "index": index,
        "token_ids": token_ids,
        "text": text,
        "logprobs": logprobs,
    }
    if steps is not None:
        event["steps"] = steps
    return orjson.dumps(event)


class FinalEvent(_Strict):
    type: Literal["final"] = "final"
    finish_reason: FinishReason
    usage: Usage = Usage()
    timings: Timings = Timings()
    error: str | None = None
    embedding: tuple[float, ...] | None = Field(
        None, description="an embed request's L2-normalised vector"
    )
    prompt_logprobs: tuple[dict[str, Any], ...] | None = Field(
        None,
        description="with sampling.prompt_logprobs: per prompt token its token_id, token"
        " (text) and bytes where the text is part of a character, logprob (null for the"
        " first token), rank (1: the likeliest) and top: the likeliest alternatives",
    )
    prompt_token_ids: tuple[int, ...] | None = Field(
        None, description="a tokenize request's prompt as the model's token ids"
    )
    detokenized: str | None = Field(None, description="a detokenize request's ids as text")
    stop_sequence: str | None = Field(None, description="the stop string that ended it, if one did")
    refusal: Refusal | None = Field(None, description="why the worker refused the request")


Event = Annotated[TokenEvent | FinalEvent, Field(discriminator="type")]


class StreamEvent(_Strict):
    """One entry of a request's token stream; ``id`` is the resume cursor."""

    id: str
    event: Event


class Result(_Strict):
    id: str
    model: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    error: str | None = None
    embedding: tuple[float, ...] | None = None
    prompt_logprobs: tuple[dict[str, Any], ...] | None = None
    refusal: Refusal | None = None


def dumps(model: BaseModel) -> bytes:
    """orjson encoding of a model, dropping nothing (defaults included)."""
    return orjson.dumps(model.model_dump(mode="json"))


class RequestStatus(_Strict):
    """A request as stored in Redis, for status pages and ``Handle.status()``."""

    id: str
    model: str
    state: RequestState
    priority: int
    attempts: int = 0
    position: int | None = Field(None, description="requests ahead of it while queued")
    worker: str | None = None
    num_generated: int = 0
    created_ms: int | None = None
    started_ms: int | None = None
    first_token_ms: int | None = None
    finished_ms: int | None = None
    deadline_ms: int | None = None
    finish_reason: FinishReason | None = None
    cancel_requested: bool = False
    tenant: str | None = Field(None, description="who submitted it (a gateway's API key)")
