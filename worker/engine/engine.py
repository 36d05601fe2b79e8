"""The engine: requests in, token deltas out, one batched step at a time.

``step()`` applies cancellations and deadlines, asks the scheduler what to run, has
the model runner launch it, and turns the tokens of the step it reads into outputs:
one protocol at any depth. Synchronously (depth 0) it reads the step it launched;
with asynchronous scheduling (depth 1, the default on a device) it launches the next
step before it reads the one in flight, so each call returns the tokens of the step
before the one it launched (``worker.engine.overlap``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence as Seq
from typing import Any

from shared.limits import ModelLimits
from shared.models import FinishReason
from shared.refusal import invalid
from worker.engine.config import EngineConfig
from worker.engine.grammar import CompilingRequests, Grammars
from worker.engine.input_processor import EngineShape, HeldCounts, InputProcessor
from worker.engine.kv_cache import KVCacheManager
from worker.engine.model_runner import ModelRunner, pick_device
from worker.engine.outputs import RequestOutput, ScheduledSeq, SchedulerOutput
from worker.engine.overlap import InFlight, Verified
from worker.engine.pooling import Pooler
from worker.engine.prompt_logprobs import PromptScores, add_step_scores
from worker.engine.prompt_tokens import TokenizerPrompts
from worker.engine.request import EngineRequest, SeqStatus, Sequence
from worker.engine.runner_support import device_broken
from worker.engine.schedule_events import ScheduleEvents
from worker.engine.scheduler import Scheduler
from worker.engine.self_check import self_check
from worker.engine.speculative.speculator import Speculator, speculator_for
from worker.engine.state_slots import CacheSizes, split_budget
from worker.engine.token_output import TokenOutputs
from worker.model_store import resolve_model

log = logging.getLogger(__name__)

# How long an idle step waits for a grammar to compile before returning to its caller.
COMPILE_WAIT_S = 0.05


class Engine(TokenizerPrompts):
    """Continuous batching over a transformers causal LM; see the package docs."""

    def __init__(self, config: EngineConfig) -> None:
        config = config.for_device(pick_device(config.device).type)
        self.config = config
        self.runner = ModelRunner(config, resolve_model(config.model))
        self.tokenizer = self.runner.tokenizer
        sizes = self._cache_sizes()
        self.runner.allocate_kv_cache(sizes.num_blocks, sizes.num_state_slots)
        self.kv_cache = KVCacheManager(
            sizes.num_blocks, config.kv_block_size, self._prefix_caching(), sizes.num_state_slots
        )
        if config.self_check:
            # Before any request: the probe writes blocks the KV cache has not handed out.
            self_check(self.runner, config.model)
        self.max_model_len = min(self.runner.max_model_len, self.kv_cache.max_num_tokens_per_seq)
        self.scheduler = Scheduler(
            self.kv_cache,
            min(config.num_seqs, sizes.num_state_slots or config.num_seqs),
            config.num_batched_tokens,
            config.prefill_chunk_tokens,
            config.aging_interval_s if config.enable_aging else None,
            ttft_priority=config.ttft_priority,
            max_num_resumed_seqs=config.max_num_resumed_seqs,
            max_loras=config.max_loras,
            recompute_at=self.runner.recompute_at,
        )
        self._seq_numbers = itertools.count()
        self.outputs = TokenOutputs(self.tokenizer, self.runner.eos_token_ids, self.max_model_len)
        self.prompt_scores = PromptScores(self.outputs.token_names)
        # The sequences with a deadline, the only ones each step checks for one.
        self._deadlines: dict[str, Sequence] = {}
        self._pending_finish: dict[str, tuple[Sequence, FinishReason]] = {}
        self.vocab_size: int = self.runner.model.config.get_text_config().vocab_size
        self.inputs = InputProcessor(self.shape, config, self.tokenizer)
        self.grammars = Grammars(
            self.tokenizer,
            self.vocab_size,
            self.runner.eos_token_ids,
            num_compile_threads=config.grammar_compile_threads,
        )
        self.compiling = CompilingRequests(self.grammars, config.grammar_compile_timeout_s)
        self.pooler = Pooler(config.pooling)
        self._in_flight: InFlight | None = None
        self.schedule_events: ScheduleEvents | None = None  # set while the worker traces
        self.num_steps = 0  # steps the runner ran (launched, when asynchronous)
        self.num_host_waits = 0  # times the host waited for a step's tokens
        self.speculator: Speculator | None = speculator_for(
            config, self.runner, self.kv_cache, self.max_model_len
        )

    def _prefix_caching(self) -> bool:
        if self.config.enable_prefix_caching and self.runner.rope_lens is not None:
            log.info(
                "prefix caching off: this model's rotary changes with a sequence's length, "
                "so the same prefix is not always the same keys and values"
            )
            return False
        if self.config.enable_prefix_caching and self.runner.state_bytes_per_seq:
            log.info(
                "prefix caching off: this hybrid model's recurrent and convolution layers "
                "keep a state per sequence that cached blocks do not hold; every prompt is "
                "computed whole"
            )
            return False
        return self.config.enable_prefix_caching

    @property
    def embedding_size(self) -> int | None:
        """The length of this model's embeddings (its hidden size): the most
        ``dimensions`` an embed request may keep."""
        return self.runner.hidden_size

    @property
    def shape(self) -> EngineShape:
        """The figures this engine's limits and capacity follow from."""
        return EngineShape(
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            model_max_len=self.runner.max_model_len,
            embedding_size=self.runner.hidden_size,
            kv_cache_budget_bytes=self.kv_cache_budget_bytes,
            max_num_seqs=self.scheduler.max_num_seqs,
            max_num_resumed_seqs=self.scheduler.max_num_resumed_seqs,
        )

    def limits(self, guided: bool) -> ModelLimits:
        """What this engine can take, for the worker to register (``shared.limits``)."""
        return self.inputs.limits(guided)

    @property
    def kv_cache_budget_bytes(self) -> int:
        """The KV blocks' bytes and a hybrid's state slots'."""
        slots = self.kv_cache.state_slots
        state_bytes = 0 if slots is None else slots.num_slots * self.runner.state_bytes_per_seq
        block_bytes = self.kv_cache.block_size * self.runner.kv_bytes_per_token
        return self.kv_cache.num_blocks * block_bytes + state_bytes

    def add_request(self, req: EngineRequest) -> None:
        """Queue ``req`` for the next steps; raises ``RequestRefused`` (a ValueError)
        naming the field at fault when it cannot run.
        A guided request whose grammar is not compiled yet joins a later step (or ends
        there with the compile's error)."""
        self._validate(req)
        if req.sampling.guided and req.grammar is None and not self.compiling.add(req):
            return
        self._join(req)

    def _join(self, req: EngineRequest) -> None:
        seq = Sequence.from_request(req, next(self._seq_numbers))
        self.outputs.start(seq)
        if req.deadline_unix_s is not None:
            self._deadlines[req.request_id] = seq
        self.scheduler.add(seq)
        if self.schedule_events is not None:
            self.schedule_events.added(seq)
        # One that asks for prompt logprobs runs its prefill for them whatever it generates.
        if (
            seq.num_output_tokens >= req.sampling.max_tokens
            and req.sampling.prompt_logprobs is None
        ):
            self._pending_finish[req.request_id] = (seq, FinishReason.LENGTH)

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> None:
        """Finish ``request_id`` at the next step with ``reason`` and no more tokens."""
        if self.compiling.abort(request_id, reason):
            return
        seq = self.scheduler.get(request_id)
        if seq is not None:
            self._pending_finish[request_id] = (seq, reason)

    def has_unfinished_requests(self) -> bool:
        return (
            self.scheduler.has_unfinished()
            or len(self.compiling) > 0
            or self._in_flight is not None
        )

    def num_free_slots(self, resumed: bool = False) -> int:
        """How many more requests to claim now (``InputProcessor.num_free_slots``),
        guided requests whose grammar compiles counted as held."""
        held = [s.request for s in (*self.scheduler.running, *self.scheduler.waiting)]
        num_compiling = len(self.compiling)
        num_new = sum(not r.resumed for r in held) + num_compiling
        return self.inputs.num_free_slots(HeldCounts(len(held) + num_compiling, num_new), resumed)

    def step(self) -> list[RequestOutput]:
        """Launch the next step and read the one due: the same step synchronously,
        the one launched before with asynchronous scheduling (see the module docs)."""
        outputs = self._admit_compiled() + self._finish_cancelled()
        if not self.scheduler.has_unfinished() and self._in_flight is None:
            self.compiling.wait(COMPILE_WAIT_S)  # rather than have the caller spin
            return outputs
        launched = self._launch(outputs) if self.scheduler.has_unfinished() else None
        done: InFlight | Verified | None = launched
        if self.config.async_scheduling and not isinstance(launched, Verified):
            done, self._in_flight = self._in_flight, launched
        if done is not None:
            outputs += self._read(done)
        return outputs

    def _launch(self, outputs: list[RequestOutput]) -> InFlight | Verified | None:
        """Schedule a step and launch it (on this thread, synchronously); the requests
        of a step whose inputs could not be built end, their finals in ``outputs``."""
        sched_out = self._schedule()
        if not sched_out.scheduled:
            return None
        try:
            launched = self._start(sched_out)
        except Exception as e:  # its inputs could not be built: its requests end
            outputs += self._step_failed(sched_out, e)
            return None
        launched.token_index = self.scheduler.advance(sched_out)
        self.num_steps += 1
        return launched

    def _start(self, sched_out: SchedulerOutput) -> InFlight | Verified:
        """The step launched; through the speculator when it is on, which runs it to its
        end here (its rows' kept drafts join their sequences: ``RunnerOutput.accepted``)."""
        if self.speculator is not None:
            return Verified(sched_out, self.speculator.execute(sched_out))
        in_thread = not self.config.async_scheduling
        return self.runner.launch(sched_out, self._in_flight, in_thread)

    def _schedule(self) -> SchedulerOutput:
        sched_out = self.scheduler.schedule()
        for seq in sched_out.preempted:
            self.pooler.discard(seq.request_id)  # computed again from its first token
        if self.schedule_events is not None:
            self.schedule_events.scheduled(sched_out)
        return sched_out

    def _read(self, done: InFlight | Verified) -> list[RequestOutput]:
        """The tokens of a launched step, each in its place, then the outputs of the
        sequences still unfinished (a sequence that finished since drops its token):
        the engine's one post-processor."""
        self.num_host_waits += 1
        sched_out = done.sched_out
        try:
            runner_out = done.result()
        except Exception as e:  # the step (or the one it took its tokens from) failed
            return self._step_failed(sched_out, e)
        self.scheduler.update_from_output(sched_out, runner_out, done.token_index)
        add_step_scores(self.prompt_scores, sched_out, runner_out)
        outputs = []
        for at, (item, index, logprobs) in enumerate(
            zip(sched_out.sampled, done.token_index, runner_out.logprobs, strict=True)
        ):
            error = runner_out.errors.get(at)
            kept = runner_out.accepted.get(at, ())
            if kept and error is None and item.seq.status is not SeqStatus.FINISHED:
                outputs += self._kept_draft_outputs(item.seq, kept, index)
            if item.seq.status is not SeqStatus.FINISHED:
                outputs.append(self._token_output(item.seq, logprobs, error, index))
        for item, partial in zip(sched_out.pooled, runner_out.pooled, strict=True):
            if item.seq.status is not SeqStatus.FINISHED:
                self.pooler.add(item.seq.request_id, partial)
                if item.completes_prompt:
                    outputs.append(self._embedding_output(item))
        return outputs

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
            **({} if self.speculator is None else self.speculator.stats.figures()),
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
        if req.request_id in self.outputs or req.request_id in self.compiling:
            raise ValueError(f"request {req.request_id} is already in the engine")
        if req.lora is not None and req.prompt_token_ids:
            self._check_lora(req)
        self.inputs.validate(req)

    def _check_lora(self, req: EngineRequest) -> None:
        """The adapter is read now (refused naming ``lora`` if it cannot be served)."""
        store, lora = self.runner.lora, req.lora
        if store is None or lora is None:
            raise invalid(
                "lora",
                "lora: this worker serves no LoRA adapters "
                "(--max-loras is 0, or the model is not Llama-shaped)",
            )
        store.check(lora)  # AdapterError, a RequestRefused naming lora

    def lora_rank_limit(self) -> int:
        """The largest adapter rank this engine serves, 0 when it serves none: the worker
        claims only the adapter requests within it."""
        return 0 if self.runner.lora is None else self.runner.lora.max_lora_rank

    def resident_loras(self) -> list[str]:
        """The adapters loaded now, for the worker registry."""
        return [] if self.runner.lora is None else self.runner.lora.resident

    def warm_fingerprints(self, limit: int) -> list[str]:
        """The prefix fingerprints whose blocks the KV cache holds, newest first."""
        return self.kv_cache.warm_fingerprints(limit)

    def _admit_compiled(self) -> list[RequestOutput]:
        ready, ended = self.compiling.take(time.time())
        for req in ready:
            self._join(req)
        return ended

    def _finish_cancelled(self) -> list[RequestOutput]:
        now = time.time()
        for request_id, seq in list(self._deadlines.items()):
            deadline = seq.request.deadline_unix_s
            if seq.status is SeqStatus.FINISHED:
                del self._deadlines[request_id]
            elif deadline is not None and deadline <= now:
                self._pending_finish.setdefault(request_id, (seq, FinishReason.TIMEOUT))
        outputs = [self._finish(seq, reason) for seq, reason in self._pending_finish.values()]
        self._pending_finish.clear()
        return outputs

    def _finish(self, seq: Sequence, reason: FinishReason) -> RequestOutput:
        seq.drop_pending()
        self.scheduler.finish(seq, reason)
        self.outputs.end(seq.request_id)
        self.pooler.discard(seq.request_id)
        self.prompt_scores.discard(seq.request_id)
        ended = RequestOutput.ended(
            seq.request_id, reason, seq.num_prompt_tokens, seq.num_output_tokens
        )
        return ended.with_prefix_figures(seq)

    def _kept_draft_outputs(
        self, seq: Sequence, kept: Seq[dict[str, Any] | None], index: int
    ) -> list[RequestOutput]:
        """The outputs of the draft tokens a speculative step kept, in order before its
        sampled token (at ``index``); the first that ends ``seq`` is its last."""
        outputs = []
        first = index - len(kept)
        for offset, logprobs in enumerate(kept):
            out = self._token_output(seq, logprobs, None, first + offset)
            outputs.append(out)
            if out.finished:
                break
        return outputs

    def _embedding_output(self, item: ScheduledSeq) -> RequestOutput:
        """An embed request ends once its whole prompt is computed: no tokens, a vector."""
        seq = item.seq
        embedding = self.pooler.finish(seq.request_id, seq.request.dimensions)
        self.scheduler.finish(seq, FinishReason.STOP)
        self.outputs.end(seq.request_id)
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
        ).with_prefix_figures(seq)

    def _token_output(
        self,
        seq: Sequence,
        logprobs: dict[str, Any] | None,
        error: str | None,
        index: int | None = None,
    ) -> RequestOutput:
        """The new token's output; a failure of this request's own (its sampling row,
        its grammar, its detokenizer or stop strings) ends it alone."""
        if error is None:
            try:
                return self._new_token_output(seq, logprobs, index)
            except Exception as e:
                log.warning("request %s failed after its token: %r", seq.request_id, e)
                error = f"internal error: the output could not be read back as text: {e!r}"
        return self._fail(seq, error)

    def _fail(self, seq: Sequence, error: str) -> RequestOutput:
        """End ``seq`` now with ``error`` (no more tokens)."""
        out = self._finish(seq, FinishReason.ERROR)
        out.error = error
        return out

    def _step_failed(self, sched_out: SchedulerOutput, e: Exception) -> list[RequestOutput]:
        """A step failed in a way pinned on no one request: its requests end (logged
        once); a broken device ends the worker."""
        if device_broken(e):
            raise e
        ended = [
            item.seq for item in sched_out.scheduled if item.seq.status is not SeqStatus.FINISHED
        ]
        if not ended:  # the step after a failed one, whose requests already ended
            return []
        log.error("engine step failed; ending its %d request(s)", len(ended), exc_info=e)
        error = f"internal error: the engine step running this request failed: {e!r}"
        return [self._fail(seq, error) for seq in ended]

    def _new_token_output(
        self, seq: Sequence, logprobs: dict[str, Any] | None, index: int | None = None
    ) -> RequestOutput:
        """The output for ``seq``'s token at ``index`` (default: its last); a token that
        ends it ends it here."""
        out = self.outputs.output(seq, logprobs, index)
        if out.finish_reason is not None and seq.sampling.prompt_logprobs is not None:
            out.prompt_logprobs = self.prompt_scores.take(
                seq.request_id, seq.request.prompt_token_ids
            )
        if out.finish_reason is not None:
            seq.drop_pending()  # tokens computed after the last one (asynchronous steps)
            self.scheduler.finish(seq, out.finish_reason)
            self.outputs.end(seq.request_id)
            out.with_prefix_figures(seq)
        return out

    def _cache_sizes(self) -> CacheSizes:
        """KV blocks and a hybrid's state slots from one budget (``split_budget``)."""
        if self.config.kv_cache_mib is not None:
            budget_bytes = self.config.kv_cache_mib << 20
        else:
            budget_bytes = int(self.runner.num_free_bytes() * self.config.cache_share)
        block_bytes = self.config.kv_block_size * self.runner.kv_bytes_per_token
        max_num_seqs = self.config.num_seqs + self.config.max_num_resumed_seqs
        state_bytes = self.runner.state_bytes_per_seq
        return split_budget(self.config.model, budget_bytes, block_bytes, state_bytes, max_num_seqs)
