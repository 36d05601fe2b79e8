"""vLLM's v1 ``LLMEngine`` behind the worker loop (``worker.engine_like.EngineLike``).

vLLM runs the model, its scheduler (priority policy) and its prefix cache, in its own
engine-core process. This side keeps, per request, what tokenq's outputs need: its
sequence of tokens, its text state (tokenq's detokenizer and stop-string matcher, so that
text, stop strings and ``stop_sequence`` are the built-in engine's, resumed requests
included), its deadline; and it turns each step's token deltas into tokenq's outputs.
Started with vLLM's pooling runner, it answers embed requests instead, each with vLLM's
pooled vector (``mapping.embedding_of``).
Only this module and ``stat_logger`` import vLLM, and only a worker started with
``--engine vllm`` imports them.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from transformers import AutoTokenizer
from vllm import PoolingParams, SamplingParams, TokensPrompt
from vllm.exceptions import VLLMClientError
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.exceptions import EngineDeadError

from shared.limits import ModelLimits
from shared.models import FinishReason
from shared.refusal import RequestRefused, invalid, too_long
from worker.engine.outputs import RequestOutput
from worker.engine.prompt_logprobs import check_prompt_length
from worker.engine.prompt_tokens import TokenizerPrompts, max_bytes_per_token
from worker.engine.request import EngineRequest, Sequence
from worker.engine.token_output import TokenOutputs
from worker.engine_like import EngineGone
from worker.vllm_engine.adapters import Adapters
from worker.vllm_engine.config import VllmEngineConfig
from worker.vllm_engine.figures import Figures
from worker.vllm_engine.guard import start_guard
from worker.vllm_engine.mapping import (
    FINISH_REASONS,
    check_embed,
    embedding_of,
    guide_name,
    logprob_entry,
    prompt_logprob_entries,
    refuse_unmapped,
    sampling_kwargs,
    structured_outputs,
    vllm_priority,
)
from worker.vllm_engine.startup import eos_token_ids_of, start_engine

log = logging.getLogger(__name__)

MAX_WARM = 1024


class VllmEngineDied(EngineGone):
    pass


@dataclass
class Live:
    """A request in vLLM: its tokens and text state (``seq``), whether vLLM still has it."""

    seq: Sequence
    in_vllm: bool = True
    # With sampling.prompt_logprobs: tokenq's entries, from vLLM's first output.
    prompt_logprobs: list[dict[str, Any]] | None = None


class VllmEngine(TokenizerPrompts):
    """See the module docs."""

    def __init__(self, config: VllmEngineConfig) -> None:
        self.figures = Figures()
        self.guard = start_guard()  # vLLM's processes die with the worker, even by SIGKILL
        self.llm = start_engine(config, self.figures)
        vllm_config = self.llm.vllm_config
        self.model_config = vllm_config.model_config
        # vLLM's pooling runner (``--runner pooling``, or a model vLLM pools by itself):
        # embeddings only, as vLLM runs no model both ways.
        self.pools: bool = self.model_config.runner_type == "pooling"
        self.max_num_seqs: int = vllm_config.scheduler_config.max_num_seqs
        self.config = replace(config, max_num_seqs=self.max_num_seqs)
        self.adapters = Adapters(self.llm, vllm_config.lora_config)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_config.tokenizer)
        self.max_model_len: int = self.model_config.max_model_len
        self.vocab_size: int = self.model_config.get_vocab_size()
        self.device = vllm_config.device_config.device_type
        self._kv_tokens = (vllm_config.cache_config.num_gpu_blocks or 0) * (
            vllm_config.cache_config.block_size
        )
        eos = eos_token_ids_of(self.model_config.model, self.tokenizer)
        self.outputs = TokenOutputs(self.tokenizer, eos, self.max_model_len)
        self._live: dict[str, Live] = {}
        self._pending_finish: dict[str, FinishReason] = {}
        self._deadlines: dict[str, float] = {}
        self._seq_numbers = itertools.count()
        self._warm: OrderedDict[str, None] = OrderedDict()

    # What the worker registers.
    @property
    def embedding_size(self) -> int | None:
        """A pooling worker's embedding length (the model's hidden size); None for a
        generating one, which computes none (``mapping.refuse_unmapped``)."""
        return self.model_config.get_hidden_size() if self.pools else None

    @property
    def kv_cache_budget_bytes(self) -> int:
        mc = self.model_config
        parallel = self.llm.vllm_config.parallel_config
        per_token = 2 * mc.get_num_layers(parallel) * mc.get_num_kv_heads(parallel)
        return int(self._kv_tokens * per_token * mc.get_head_size() * mc.dtype.itemsize)

    def limits(self, guided: bool) -> ModelLimits:
        return ModelLimits(
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            embedding_size=self.embedding_size,
            generates=not self.pools,
            guided=guided and not self.pools,
            # vLLM's prompt_logprobs (``mapping.prompt_logprob_entries``), but with LoRA
            prompt_scores=self.adapters.max_loras == 0,
            max_bytes_per_token=self._max_bytes_per_token,
        )

    @cached_property
    def _max_bytes_per_token(self) -> int:
        return max_bytes_per_token(self.tokenizer)

    def lora_rank_limit(self) -> int:
        """The largest adapter rank vLLM takes, 0 when started without LoRA: the worker
        claims only the adapter requests within it."""
        return self.adapters.max_lora_rank

    def resident_loras(self) -> list[str]:
        return self.adapters.resident()

    def warm_fingerprints(self, limit: int) -> list[str]:
        """The prefix fingerprints of the prompts it served, newest first: vLLM's prefix
        cache holds their blocks until newer ones push them out."""
        return list(itertools.islice(reversed(self._warm), limit))

    # Requests in.
    def add_request(self, req: EngineRequest) -> None:
        """Hand ``req`` to vLLM; RequestRefused naming the field when it cannot run."""
        self._validate(req)
        seq = Sequence.from_request(req, next(self._seq_numbers))
        self.outputs.start(seq)
        self._live[req.request_id] = Live(seq)
        if req.deadline_unix_s is not None:
            self._deadlines[req.request_id] = req.deadline_unix_s
        for fingerprint, _ in req.prefix_cuts:
            self._warm[fingerprint] = None
            self._warm.move_to_end(fingerprint)
        while len(self._warm) > MAX_WARM:
            self._warm.popitem(last=False)
        max_tokens = req.sampling.max_tokens
        if max_tokens and seq.num_output_tokens >= max_tokens:  # resumed with all it may have
            self._live[req.request_id].in_vllm = False
            self._pending_finish[req.request_id] = FinishReason.LENGTH
            return
        self._submit(req, seq)

    def _submit(self, req: EngineRequest, seq: Sequence) -> None:
        prompt = TokensPrompt(prompt_token_ids=list(seq.token_ids))  # prompt and kept tokens
        if req.cache_salt:
            prompt["cache_salt"] = req.cache_salt.hex()
        guide = structured_outputs(req.sampling)
        params = self._params(req, guide)
        try:
            lora_request = self.adapters.request(req.lora)
        except RequestRefused:
            self._forget(req.request_id)
            raise
        try:
            self.llm.add_request(
                req.request_id,
                prompt,
                params,
                lora_request=lora_request,
                priority=vllm_priority(req.priority),
            )
        except (ValueError, VLLMClientError) as e:  # vLLM's own checks: the request's fault
            self._forget(req.request_id)
            # What tokenq has not checked itself, before: the grammar vLLM compiles.
            raise invalid(guide_name(req.sampling), f"vLLM refused the request: {e}") from e

    def _params(self, req: EngineRequest, guide: dict[str, str] | None) -> Any:
        if req.embed:  # vLLM's whole, L2-normalised vector: ``dimensions`` kept here
            return PoolingParams(task="embed")
        return SamplingParams(
            **sampling_kwargs(req),
            structured_outputs=None if guide is None else StructuredOutputsParams(**guide),
            output_kind=RequestOutputKind.DELTA,
        )

    def _validate(self, req: EngineRequest) -> None:
        if not req.prompt_token_ids:
            raise invalid("prompt", "prompt: it has no tokens")
        if req.request_id in self._live:
            raise ValueError(f"request {req.request_id} is already in the engine")
        refuse_unmapped(req, serves_lora=self.adapters.max_loras > 0, pools=self.pools)
        if req.embed:
            check_embed(req, self.max_model_len, self.embedding_size)
            return
        check_prompt_length(req)  # prompt_logprobs' bound, as the built-in engine's
        num_needed = len(req.prompt_token_ids) + req.sampling.max_tokens
        if num_needed > self.max_model_len:
            param = "prompt" if len(req.prompt_token_ids) >= self.max_model_len else "max_tokens"
            raise too_long(
                param,
                f"{param}: {len(req.prompt_token_ids)} prompt tokens and max_tokens "
                f"{req.sampling.max_tokens} need {num_needed} tokens of context, over the "
                f"{self.max_model_len} this vLLM worker takes; shorten the prompt or lower "
                "max_tokens",
            )
        for field, ids in (
            ("logit_bias", req.sampling.logit_bias),
            ("stop_token_ids", req.sampling.stop_token_ids),
        ):
            too_big = [t for t in ids if t >= self.vocab_size]
            if too_big:
                raise invalid(
                    field,
                    f"{field}: token id {too_big[0]} is not in this model's vocabulary of "
                    f"{self.vocab_size} tokens (ids 0..{self.vocab_size - 1})",
                )

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> None:
        """Finish ``request_id`` at the next step with ``reason`` and no more tokens."""
        if request_id in self._live:
            self._pending_finish.setdefault(request_id, reason)

    # Steps.
    def has_unfinished_requests(self) -> bool:
        return bool(self._live)

    def num_free_slots(self, resumed: bool = False) -> int:
        """How many more requests to claim, from vLLM's latest figures."""
        return self.figures.num_free_slots(self.max_num_seqs, len(self._live), resumed)

    def step(self) -> list[RequestOutput]:
        outputs = self._finish_cancelled()
        if not self.llm.has_unfinished_requests():
            return outputs
        try:
            stepped = self.llm.step()
        except EngineDeadError as e:
            raise VllmEngineDied(f"vLLM's engine core died: {e}") from e
        for vllm_out in stepped:
            out = self._output(vllm_out)
            if out is not None:
                outputs.append(out)
        return outputs

    def _finish_cancelled(self) -> list[RequestOutput]:
        now = time.time()
        for request_id, deadline in list(self._deadlines.items()):
            if request_id not in self._live:
                del self._deadlines[request_id]
            elif deadline <= now:
                self._pending_finish.setdefault(request_id, FinishReason.TIMEOUT)
        ended = [(rid, reason) for rid, reason in self._pending_finish.items()]
        self._pending_finish.clear()
        return [self._end(rid, reason) for rid, reason in ended if rid in self._live]

    def _end(self, request_id: str, reason: FinishReason) -> RequestOutput:
        """End a request with no more tokens (vLLM lets go of it too)."""
        seq = self._forget(request_id)
        return RequestOutput.ended(request_id, reason, seq.num_prompt_tokens, seq.num_output_tokens)

    def _forget(self, request_id: str) -> Sequence:
        live = self._live.pop(request_id)
        self._deadlines.pop(request_id, None)
        self.outputs.end(request_id)
        if live.in_vllm:
            self.llm.abort_request([request_id])
        return live.seq

    def _output(self, vllm_out: Any) -> RequestOutput | None:
        """vLLM's delta for one request as tokenq's output: each new token through
        tokenq's finish checks and text state (the first that ends it ends it)."""
        live = self._live.get(vllm_out.request_id)
        if live is None:  # ended on this side meanwhile
            return None
        if live.seq.request.embed:
            return self._embedding(live, vllm_out)
        completion = vllm_out.outputs[0]
        seq, num_top = live.seq, live.seq.sampling.logprobs or 0
        if vllm_out.finished:
            live.in_vllm = False
        scored = self._prompt_scores(live, vllm_out)
        if scored is not None:
            return scored
        merged: RequestOutput | None = None
        for at, token_id in enumerate(completion.token_ids):
            seq.token_ids.append(token_id)
            entry = None
            if completion.logprobs is not None:
                entry = logprob_entry(token_id, completion.logprobs[at], num_top)
            out = self.outputs.output(seq, entry)
            merged = out if merged is None else _merged(merged, out)
            if out.finish_reason is not None:
                break
        if merged is not None and merged.finish_reason is not None:
            return self._ended(vllm_out, merged)
        if vllm_out.finished:  # vLLM ended it for a reason tokenq's checks did not see
            reason = FINISH_REASONS.get(completion.finish_reason or "", FinishReason.ERROR)
            end = self._end(vllm_out.request_id, reason)
            end = end if merged is None else _merged(merged, end)
            end.prompt_logprobs = live.prompt_logprobs
            return end
        return merged

    def _embedding(self, live: Live, vllm_out: Any) -> RequestOutput | None:
        """vLLM's ``PoolingRequestOutput`` as tokenq's: no tokens, the vector."""
        if not vllm_out.finished:
            return None
        live.in_vllm = False
        seq = live.seq
        out = RequestOutput.ended(seq.request_id, FinishReason.STOP, seq.num_prompt_tokens, 0)
        out.embedding = embedding_of(vllm_out.outputs.data.tolist(), seq.request.dimensions)
        return self._ended(vllm_out, out)

    def _prompt_scores(self, live: Live, vllm_out: Any) -> RequestOutput | None:
        """Keep the prompt logprobs vLLM gives with a request's first output; a request
        that scores its prompt alone (max_tokens 0) ends here, vLLM's one token dropped."""
        sampling = live.seq.sampling
        if vllm_out.prompt_logprobs and sampling.prompt_logprobs is not None:
            try:
                live.prompt_logprobs = prompt_logprob_entries(
                    live.seq.request.prompt_token_ids,
                    vllm_out.prompt_logprobs,
                    sampling.prompt_logprobs,
                    self.outputs.token_names,
                )
            except ValueError as e:  # never given with a gap
                return replace(self._end(vllm_out.request_id, FinishReason.ERROR), error=str(e))
        if sampling.max_tokens != 0:
            return None
        num_prompt_tokens = live.seq.num_prompt_tokens
        ended = RequestOutput.ended(vllm_out.request_id, FinishReason.LENGTH, num_prompt_tokens, 0)
        return self._ended(vllm_out, ended)

    def _ended(self, vllm_out: Any, out: RequestOutput) -> RequestOutput:
        out.prompt_logprobs = self._live[vllm_out.request_id].prompt_logprobs
        self._forget(vllm_out.request_id)
        out.num_prefix_queried_tokens = len(vllm_out.prompt_token_ids or ())
        out.num_prefix_hit_tokens = vllm_out.num_cached_tokens or 0
        return out

    def stats(self) -> dict[str, float]:
        """vLLM's figures for the worker's metrics and registry entry."""
        return self.figures.stats()


def _merged(first: RequestOutput, then: RequestOutput) -> RequestOutput:
    """One output for several tokens of one step (vLLM's speculative steps give more)."""
    first.new_token_ids = [*first.new_token_ids, *then.new_token_ids]
    first.text += then.text
    if then.logprobs is not None:
        first.logprobs = [*(first.logprobs or []), *then.logprobs]
    first.finish_reason = then.finish_reason
    first.num_output_tokens = then.num_output_tokens
    first.stop_sequence = then.stop_sequence
    first.error = then.error
    return first
