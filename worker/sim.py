"""A SIMULATED model backend, for scaling tests and demos: no weights, no torch.

``--model sim:`` (or ``sim:step_ms=30,knee=32,max_num_seqs=64``) gives a worker
whose engine answers like a real one (same interface, continuous batching, token
events, cancel, deadlines) but whose step takes ``step_ms`` up to ``knee``
sequences and grows linearly past it, as a GPU's step time does once the batch
saturates it. Its text is made-up tokens ("sim0 sim1 ..."); it is clearly not a
language model, and every place that shows the model name shows ``sim:``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from shared.models import FinishReason
from shared.refusal import invalid, too_long
from worker.engine.outputs import RequestOutput
from worker.engine.request import EngineRequest

PREFIX = "sim:"
SIM_VOCAB_SIZE = 32_000  # what a token-id prompt is checked against: a Llama-sized vocabulary


@dataclass
class SimConfig:
    step_ms: float = 30.0
    knee: int = 32
    max_num_seqs: int = 64
    max_model_len: int = 8192
    # From the worker's --max-loras and --max-lora-rank: which adapter requests it
    # claims (it runs them as the base model).
    max_loras: int = 4
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        if self.max_loras < 0 or self.max_lora_rank < 1:
            raise ValueError(
                f"--max-loras must be at least 0 (got {self.max_loras}) and --max-lora-rank "
                f"at least 1 (got {self.max_lora_rank})"
            )

    @classmethod
    def parse(cls, model: str) -> SimConfig:
        """``sim:`` or ``sim:step_ms=30,knee=32,max_num_seqs=64``."""
        spec = model.removeprefix(PREFIX)
        fields: dict[str, Any] = {}
        for item in filter(None, spec.split(",")):
            name, _, value = item.partition("=")
            if name not in SPEC_FIELDS:
                raise ValueError(f"unknown simulation setting {name!r} in {model!r}")
            fields[name] = float(value) if name == "step_ms" else int(value)
        return cls(**fields)

    def step_s(self, batch: int) -> float:
        return self.step_ms / 1000 * max(1.0, batch / self.knee)


SPEC_FIELDS = ("step_ms", "knee", "max_num_seqs", "max_model_len")


def is_sim(model: str) -> bool:
    return model.startswith(PREFIX)


@dataclass
class SimEngine:
    """The engine's interface over a timer (see the module docstring)."""

    sim: SimConfig = field(default_factory=SimConfig)
    running: dict[str, EngineRequest] = field(default_factory=dict)
    aborted: dict[str, FinishReason] = field(default_factory=dict)
    device: str = "simulated"

    @property
    def config(self) -> SimConfig:
        return self.sim

    @property
    def kv_cache_budget_bytes(self) -> int:
        return 0

    @property
    def embedding_size(self) -> int | None:
        return None  # a simulated model computes no embeddings

    @property
    def vocab_size(self) -> int:
        return SIM_VOCAB_SIZE

    def encode_prompt(self, prompt: str) -> list[int]:
        return list(range(len(prompt.split())))

    def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.encode_prompt(text)

    def decode_tokens(self, token_ids: list[int]) -> str:
        """A word a token (the simulation has no vocabulary to read them by)."""
        return " ".join(f"t{t}" for t in token_ids)

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """A token a word of the messages' contents (tools and kwargs shape nothing here)."""
        return self.encode_prompt(" ".join(str(m["content"]) for m in messages))

    def add_request(self, req: EngineRequest) -> None:
        if req.embed:
            raise invalid("task", "a simulated model computes no embeddings; use a real model")
        if len(req.prompt_token_ids) >= self.sim.max_model_len:
            num_prompt = len(req.prompt_token_ids)
            raise too_long("prompt", f"prompt of {num_prompt} tokens exceeds the context")
        self.running[req.request_id] = req

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> None:
        if request_id in self.running:
            self.aborted[request_id] = reason

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def num_free_slots(self, resumed: bool = False) -> int:
        return self.sim.max_num_seqs - len(self.running)

    def stats(self) -> dict[str, float]:
        return {"running": len(self.running), "waiting": 0, "kv_cache_usage": 0.0}

    def resident_loras(self) -> list[str]:
        return []  # the simulation runs every request as the base model

    def lora_rank_limit(self) -> int:
        return 0 if self.sim.max_loras == 0 else self.sim.max_lora_rank

    def warm_fingerprints(self, limit: int) -> list[str]:
        return []  # the simulation keeps no KV cache

    def step(self) -> list[RequestOutput]:
        time.sleep(self.sim.step_s(len(self.running)))
        return [self._advance(req) for req in list(self.running.values())]

    def _advance(self, req: EngineRequest) -> RequestOutput:
        n = len(req.output_token_ids)
        reason = self.aborted.pop(req.request_id, None) or self._timeout(req)
        ids: list[int] = []
        if reason is None:
            ids = [n]
            req.output_token_ids.append(n)
            if len(req.output_token_ids) >= req.sampling.max_tokens:
                reason = FinishReason.LENGTH
        if reason is not None:
            del self.running[req.request_id]
        return RequestOutput(
            request_id=req.request_id,
            index=n,
            new_token_ids=ids,
            text="".join(f"sim{i} " for i in ids),
            finish_reason=reason,
            logprobs=None,
            num_prompt_tokens=len(req.prompt_token_ids),
            num_output_tokens=len(req.output_token_ids),
        )

    @staticmethod
    def _timeout(req: EngineRequest) -> FinishReason | None:
        late = req.deadline_unix_s is not None and time.time() >= req.deadline_unix_s
        return FinishReason.TIMEOUT if late else None
