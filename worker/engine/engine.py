"""The engine: requests in, token deltas out, one batched step at a time.

``step()`` applies cancellations and deadlines, asks the scheduler what to run,
has the model runner run it, and turns the new tokens into outputs.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

from shared.models import FinishReason
from worker.engine.config import EngineConfig
from worker.engine.grammar import CompilingRequests, Grammars
from worker.engine.kv_cache import KVCacheManager
from worker.engine.model_runner import ModelRunner, pick_device
from worker.engine.outputs import RequestOutput, RunnerOutput, ScheduledSeq, SchedulerOutput
from worker.engine.pooling import Pooler
from worker.engine.request import EngineRequest, Sequence
from worker.engine.resume import resume_text_state
from worker.engine.scheduler import Scheduler
from worker.engine.self_check import self_check
from worker.model_store import resolve_model

log = logging.getLogger(__name__)

# How long an idle step waits for a grammar to compile before returning to its caller.
COMPILE_WAIT_S = 0.05


class _TextState:
    """Per-request text: the incremental detokenizer and the stop-string matcher."""

    def __init__(self, engine: Engine, seq: Sequence) -> None:
        req = seq.request
        self.detokenizer, self.stop = resume_text_state(
            engine.tokenizer,
            req.prompt_token_ids,
            req.output_token_ids,
            req.output_text,
            seq.sampling.stop,
        )


class Engine:
    """Continuous batching over a transformers causal LM; see the package docs."""

    def __init__(self, config: EngineConfig) -> None:
        config = config.for_device(pick_device(config.device).type)
        self.config = config
        self.runner = ModelRunner(config, resolve_model(config.model))
        self.tokenizer = self.runner.tokenizer
        num_blocks = self._num_kv_blocks()
        self.runner.allocate_kv_cache(num_blocks)
        self.kv_cache = KVCacheManager(num_blocks, config.kv_block_size, self._prefix_caching())
        if config.self_check:
            # Before any request: the probe writes blocks the KV cache has not handed out.
            self_check(self.runner, config.model)
        self.max_model_len = min(self.runner.max_model_len, self.kv_cache.max_num_tokens_per_seq)
        self.scheduler = Scheduler(
            self.kv_cache,
            config.num_seqs,
            config.num_batched_tokens,
            config.prefill_chunk_tokens,
            config.aging_interval_s if config.enable_aging else None,
            ttft_priority=config.ttft_priority,
            max_num_resumed_seqs=config.max_num_resumed_seqs,
            max_loras=config.max_loras,
            recompute_at=self.runner.recompute_at,
        )
        self._seq_numbers = itertools.count()
        self._text: dict[str, _TextState] = {}
        self._pending_finish: dict[str, tuple[Sequence, FinishReason]] = {}
        self.vocab_size: int = self.runner.model.config.get_text_config().vocab_size
        self.grammars = Grammars(self.tokenizer, self.vocab_size, self.runner.eos_token_ids)
        self.compiling = CompilingRequests(self.grammars)
        self.pooler = Pooler(config.pooling)

    def _prefix_caching(self) -> bool:
        if self.config.enable_prefix_caching and self.runner.rope_lens is not None:
            log.info(
                "prefix caching off: this model's rotary changes with a sequence's length, "
                "so the same prefix is not always the same keys and values"
            )
            return False
        return self.config.enable_prefix_caching

    @property
    def embedding_size(self) -> int | None:
        """The length of this model's embeddings (its hidden size): the most
        ``dimensions`` an embed request may keep."""
        return self.runner.hidden_size

    @property
    def kv_cache_budget_bytes(self) -> int:
        return self.kv_cache.num_blocks * self.kv_cache.block_size * self.runner.kv_bytes_per_token

    def encode_prompt(self, prompt: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(prompt)
        return ids

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """The chat prompt's tokens: ``messages`` (OpenAI's shape) and ``tools`` (OpenAI
        function tools) through the chat template, with ``template_kwargs`` as its
        extra variables (``enable_thinking``...)."""
        template_tools: Any = tools
        encoded: Any = self.tokenizer.apply_chat_template(
            messages,
            tools=template_tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **(template_kwargs or {}),
        )
        ids: list[int] = list(encoded["input_ids"])
        return ids

    def add_request(self, req: EngineRequest) -> None:
        """Queue ``req`` for the next steps; raises ``ValueError`` when it cannot run.
        A guided request whose grammar is not compiled yet joins a later step (or ends
        there with the compile's error)."""
        self._validate(req)
        if req.sampling.guided and req.grammar is None and not self.compiling.add(req):
            return
        self._join(req)

    def _join(self, req: EngineRequest) -> None:
        seq = Sequence.from_request(req, next(self._seq_numbers))
        self._text[req.request_id] = _TextState(self, seq)
        self.scheduler.add(seq)
        if seq.num_output_tokens >= req.sampling.max_tokens:
            self._pending_finish[req.request_id] = (seq, FinishReason.LENGTH)

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> None:
        """Finish ``request_id`` at the next step with ``reason`` and no more tokens."""
        if self.compiling.abort(request_id, reason):
            return
        seq = self.scheduler.get(request_id)
        if seq is not None:
            self._pending_finish[request_id] = (seq, reason)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or len(self.compiling) > 0

    def num_free_slots(self, resumed: bool = False) -> int:
        """How many more requests to claim now: free batch rows plus a small
        look-ahead, so a more urgent request can wait here and preempt; with
        ``resumed``, how many requests resumed mid-answer (they have rows kept)."""
        held = [s.request for s in (*self.scheduler.running, *self.scheduler.waiting)]
        num_compiling = len(self.compiling)  # guided requests whose grammar compiles
        capacity = self.scheduler.max_num_seqs + self.config.num_lookahead_slots
        if resumed:
            capacity += self.scheduler.max_num_resumed_seqs
            return max(0, capacity - len(held) - num_compiling)
        return max(0, capacity - sum(not r.resumed for r in held) - num_compiling)

    def step(self) -> list[RequestOutput]:
        outputs = self._admit_compiled() + self._finish_cancelled()
        if not self.scheduler.has_unfinished():
            self.compiling.wait(COMPILE_WAIT_S)  # rather than have the caller spin
            return outputs
        sched_out = self.scheduler.schedule()
        if not sched_out.scheduled:
            return outputs
        for seq in sched_out.preempted:
            self.pooler.discard(seq.request_id)  # computed again from its first token
        runner_out = self.runner.execute(sched_out)
        self.scheduler.update_from_output(sched_out, runner_out)
        return outputs + self._postprocess(sched_out, runner_out)

    @property
    def device(self) -> str:
        """Where the model runs ("cpu", "cuda:0", ...), for the worker registry."""
        return str(self.runner.device)

    def stats(self) -> dict[str, float]:
        """Figures for the worker's metrics and registry entry."""
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "kv_cache_usage": self.kv_cache.usage,
            "preemptions": self.scheduler.num_preemptions,
            "prefix_cache_queries": self.kv_cache.num_queried_tokens,
            "prefix_cache_hits": self.kv_cache.num_hit_tokens,
        }

    def generate(self, requests: list[EngineRequest]) -> dict[str, list[RequestOutput]]:
        """Run ``requests`` to completion; every output of each, in order."""
        results: dict[str, list[RequestOutput]] = {r.request_id: [] for r in requests}
        for req in requests:
            self.add_request(req)
        while self.has_unfinished_requests():
            for output in self.step():
                results[output.request_id].append(output)
        return results

    def _validate(self, req: EngineRequest) -> None:
        if not req.prompt_token_ids:
            raise ValueError(f"request {req.request_id}: the prompt has no tokens")
        if req.request_id in self._text or req.request_id in self.compiling:
            raise ValueError(f"request {req.request_id} is already in the engine")
        if req.lora is not None:
            self._check_lora(req)
        if req.embed:
            self._validate_embed(req)
            return
        num_tokens = len(req.prompt_token_ids) + len(req.output_token_ids)
        num_needed = len(req.prompt_token_ids) + req.sampling.max_tokens
        limit, what = self._context_limit()
        if num_tokens >= self.max_model_len or num_needed > self.max_model_len:
            raise ValueError(
                f"request {req.request_id}: {len(req.prompt_token_ids)} prompt tokens and "
                f"max_tokens {req.sampling.max_tokens} need {num_needed} tokens of context, "
                f"over the {limit} that {what}; shorten the prompt or lower max_tokens"
            )
        too_big = [t for t in req.sampling.logit_bias if t >= self.vocab_size]
        if too_big:
            raise ValueError(
                f"request {req.request_id}: logit_bias token id {too_big[0]} is not in this "
                f"model's vocabulary of {self.vocab_size} tokens"
            )

    def _check_lora(self, req: EngineRequest) -> None:
        """The adapter is read now (AdapterError, a ValueError, if it cannot be served)."""
        store, lora = self.runner.lora, req.lora
        if store is None or lora is None:
            raise ValueError(
                f"request {req.request_id}: this worker serves no LoRA adapters "
                "(--max-loras is 0, or the model is not Llama-shaped)"
            )
        store.check(lora)

    def lora_rank_limit(self) -> int:
        """The largest adapter rank this engine serves, 0 when it serves none: the worker
        claims only the adapter requests within it."""
        return 0 if self.runner.lora is None else self.runner.lora.max_lora_rank

    def resident_loras(self) -> list[str]:
        """The adapters loaded now, for the worker registry."""
        return [] if self.runner.lora is None else self.runner.lora.resident

    def _validate_embed(self, req: EngineRequest) -> None:
        limit, what = self._context_limit()
        if len(req.prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"request {req.request_id}: the text to embed is {len(req.prompt_token_ids)} "
                f"tokens, over the {limit} that {what}; shorten it"
            )
        size = self.runner.hidden_size
        if req.dimensions is not None and req.dimensions > size:
            raise ValueError(
                f"request {req.request_id}: dimensions {req.dimensions} is more than this "
                f"model's {size}; ask for {size} or fewer"
            )

    def _context_limit(self) -> tuple[int, str]:
        """The tokens one request may hold, and what sets that limit."""
        pool_tokens = self.kv_cache.max_num_tokens_per_seq
        if pool_tokens < self.runner.max_model_len:
            mib = self.kv_cache_budget_bytes >> 20
            return pool_tokens, f"this worker's KV cache holds ({mib} MiB; see --kv-cache-mib)"
        return self.runner.max_model_len, "the model takes (its max_model_len)"

    def _admit_compiled(self) -> list[RequestOutput]:
        ready, ended = self.compiling.take(time.time())
        for req in ready:
            self._join(req)
        return ended

    def _finish_cancelled(self) -> list[RequestOutput]:
        now = time.time()
        for seq in (*self.scheduler.running, *self.scheduler.waiting):
            deadline = seq.request.deadline_unix_s
            if deadline is not None and deadline <= now:
                self._pending_finish.setdefault(seq.request_id, (seq, FinishReason.TIMEOUT))
        outputs = [self._finish(seq, reason) for seq, reason in self._pending_finish.values()]
        self._pending_finish.clear()
        return outputs

    def _finish(self, seq: Sequence, reason: FinishReason) -> RequestOutput:
        self.scheduler.finish(seq, reason)
        self._text.pop(seq.request_id, None)
        self.pooler.discard(seq.request_id)
        return RequestOutput(
            seq.request_id,
            seq.num_output_tokens,
            [],
            "",
            reason,
            None,
            seq.num_prompt_tokens,
            seq.num_output_tokens,
        )

    def _postprocess(
        self, sched_out: SchedulerOutput, runner_out: RunnerOutput
    ) -> list[RequestOutput]:
        outputs = []
        for item, logprobs in zip(sched_out.sampled, runner_out.logprobs, strict=True):
            outputs.append(self._new_token_output(item.seq, logprobs))
        for item, partial in zip(sched_out.pooled, runner_out.pooled, strict=True):
            self.pooler.add(item.seq.request_id, partial)
            if item.completes_prompt:
                outputs.append(self._embedding_output(item))
        return outputs

    def _embedding_output(self, item: ScheduledSeq) -> RequestOutput:
        """An embed request ends once its whole prompt is computed: no tokens, a vector."""
        seq = item.seq
        embedding = self.pooler.finish(seq.request_id, seq.request.dimensions)
        self.scheduler.finish(seq, FinishReason.STOP)
        self._text.pop(seq.request_id, None)
        return RequestOutput(
            seq.request_id,
            0,
            [],
            "",
            FinishReason.STOP,
            None,
            seq.num_prompt_tokens,
            0,
            embedding=embedding,
        )

    def _new_token_output(self, seq: Sequence, logprobs: dict[str, Any] | None) -> RequestOutput:
        token_id = seq.token_ids[-1]
        params = seq.sampling
        reason = self._token_finish_reason(seq, token_id)
        state = self._text[seq.request_id]
        delta = "" if reason is not None else state.detokenizer.add([token_id])
        can_stop = seq.num_output_tokens >= params.min_tokens
        text, stopped = state.stop.add(delta, can_stop)
        if stopped:
            reason = FinishReason.STOP
        elif reason is None and self._at_length(seq):
            reason = FinishReason.LENGTH
        if reason is not None:
            text += "" if stopped else state.stop.flush()
            self.scheduler.finish(seq, reason)
            self._text.pop(seq.request_id, None)
        return RequestOutput(
            seq.request_id,
            seq.num_output_tokens - 1,
            [token_id],
            text,
            reason,
            [logprobs] if logprobs is not None else None,
            seq.num_prompt_tokens,
            seq.num_output_tokens,
        )

    def _token_finish_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        params = seq.sampling
        if token_id in params.stop_token_ids:
            return FinishReason.STOP
        if not params.ignore_eos and token_id in self.runner.eos_token_ids:
            return FinishReason.STOP
        grammar = seq.request.grammar
        if grammar is not None and (not grammar.accept(token_id) or grammar.terminated):
            return FinishReason.STOP  # the output is complete (or the grammar is stuck)
        return None

    def _at_length(self, seq: Sequence) -> bool:
        return (
            seq.num_output_tokens >= seq.sampling.max_tokens or seq.num_tokens >= self.max_model_len
        )

    def _num_kv_blocks(self) -> int:
        if self.config.kv_cache_mib is not None:
            budget_bytes = self.config.kv_cache_mib << 20
        else:
            budget_bytes = int(self.runner.num_free_bytes() * self.config.cache_share)
        block_bytes = self.config.kv_block_size * self.runner.kv_bytes_per_token
        return max(1, budget_bytes // block_bytes)
