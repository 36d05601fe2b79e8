"""A scripted stand-in for the engine: one token per step per request, text 't<i>'.

It lets the worker loop be tested against fakeredis in milliseconds; the real
engine runs in tests/worker/engine and tests/integration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.models import FinishReason
from worker.engine import EngineRequest, RequestOutput

if TYPE_CHECKING:
    from worker.service import WorkerService


def lockstep(service: WorkerService) -> WorkerService:
    """``service`` in lock-step with Redis (``overlap_redis`` off): each write acted on
    after the one step it overlaps, claims made between steps, so that a test turning
    the loop by hand sees each turn's effects at once."""
    service.overlap_redis = False
    return service


@dataclass
class ScriptedEngine:
    max_num_seqs: int = 4
    max_num_resumed_seqs: int = 0
    running: dict[str, EngineRequest] = field(default_factory=dict)
    aborted: dict[str, FinishReason] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)
    # Requests to end at their next step with FinishReason.ERROR and this message.
    failing: dict[str, str] = field(default_factory=dict)
    max_prompt_tokens: int = 1000
    # The largest LoRA rank it serves (0: none), as the worker's --max-lora-rank.
    lora_rank: int = 16

    def encode_prompt(self, prompt: str) -> list[int]:
        return list(range(len(prompt.split())))

    def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        """A token a word, after a BOS (999) when special tokens are added."""
        return [999] * add_special_tokens + list(range(len(text.split())))

    def decode_tokens(self, token_ids: list[int]) -> str:
        return " ".join(f"w{t}" for t in token_ids)

    @property
    def vocab_size(self) -> int:
        return 1000

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        return self.encode_prompt(" ".join(m["content"] for m in messages))

    def add_request(self, req: EngineRequest) -> None:
        if len(req.prompt_token_ids) > self.max_prompt_tokens:
            raise ValueError(f"prompt has {len(req.prompt_token_ids)} tokens, over the context")
        self.running[req.request_id] = req
        self.added.append(req.request_id)

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> None:
        if request_id in self.running:
            self.aborted[request_id] = reason

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def num_free_slots(self, resumed: bool = False) -> int:
        extra = self.max_num_resumed_seqs if resumed else 0
        return self.max_num_seqs + extra - len(self.running)

    def stats(self) -> dict[str, float]:
        return {"running": len(self.running), "waiting": 0, "kv_cache_usage": 0.0}

    def resident_loras(self) -> list[str]:
        return sorted({r.lora.name for r in self.running.values() if r.lora is not None})

    def lora_rank_limit(self) -> int:
        return self.lora_rank

    def warm_fingerprints(self, limit: int) -> list[str]:
        return []

    def step(self) -> list[RequestOutput]:
        return [self._advance(req) for req in list(self.running.values())]

    def _advance(self, req: EngineRequest) -> RequestOutput:
        n = len(req.output_token_ids)
        if req.request_id in self.failing:
            del self.running[req.request_id]
            output = self._output(req, n, [], FinishReason.ERROR)
            output.error = self.failing.pop(req.request_id)
            return output
        if req.request_id in self.aborted:
            del self.running[req.request_id]
            return self._output(req, n, [], self.aborted.pop(req.request_id))
        req.output_token_ids.append(n)
        done = len(req.output_token_ids) >= req.sampling.max_tokens
        if done:
            del self.running[req.request_id]
        return self._output(req, n, [n], FinishReason.LENGTH if done else None)

    def _output(
        self, req: EngineRequest, index: int, ids: list[int], reason: FinishReason | None
    ) -> RequestOutput:
        return RequestOutput(
            request_id=req.request_id,
            index=index,
            new_token_ids=ids,
            text="".join(f"t{i}" for i in ids),
            finish_reason=reason,
            logprobs=None,
            num_prompt_tokens=len(req.prompt_token_ids),
            num_output_tokens=len(req.output_token_ids),
        )
