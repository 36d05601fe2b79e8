"""Prompt logprobs: each prompt token's logprob under the model, from the prefill.

A request with ``sampling.prompt_logprobs`` has its prefill chunks' logits computed at
every prompt position, not only the last (``ScheduledSeq.num_prompt_scores``): position
``p``'s logits score prompt token ``p + 1`` (the first token has no score, as OpenAI's and
vLLM's). The runner reduces them on the device to what is kept (``pack``: the token's
logprob and rank, the top alternatives), one chunk at a time, so a prefill never holds a
whole prompt's logits; the engine gathers the chunks per request (:class:`PromptScores`)
and hands them over with the request's last output.

Such a request takes no prefix-cache hits (``KVCacheManager.cached_prefix``): a cached
block's positions would have no logits, so they are computed again, as vLLM does. A
preempted or resumed request computes its prompt from its first token, and positions
scored twice are kept once. A request whose scores do not cover its prompt ends with an
error rather than a gap.
"""

from __future__ import annotations

from typing import Any

import torch

from shared.models import MAX_PROMPT_LOGPROBS_TOKENS
from worker.engine.detokenizer import TokenNames
from worker.engine.outputs import RunnerOutput, SchedulerOutput
from worker.engine.request import EngineRequest, SeqStatus

# Prompt positions reduced at a time: a chunk's [positions, vocab] logprobs are that
# many rows at most.
NUM_ROWS_AT_A_TIME = 256


class PromptLogprobsGap(RuntimeError):
    """A request's prompt logprobs do not cover its prompt (never given with a gap)."""


def pack(logits: torch.Tensor, targets: torch.Tensor, num_top: int) -> torch.Tensor:
    """``[positions, 3 + 2 * num_top]`` float64: each scored token's id, its logprob and
    rank (1 + the tokens more likely), then the top ids and their logprobs."""
    parts = [
        _pack_rows(
            logits[at : at + NUM_ROWS_AT_A_TIME], targets[at : at + NUM_ROWS_AT_A_TIME], num_top
        )
        for at in range(0, logits.shape[0], NUM_ROWS_AT_A_TIME)
    ]
    return (
        torch.cat(parts) if parts else logits.new_zeros((0, 3 + 2 * num_top), dtype=torch.float64)
    )


def _pack_rows(logits: torch.Tensor, targets: torch.Tensor, num_top: int) -> torch.Tensor:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, targets[:, None])
    rank = (logprobs > chosen).sum(dim=1, keepdim=True) + 1
    columns = [targets[:, None].double(), chosen.double(), rank.double()]
    if num_top:
        values, indices = torch.topk(logprobs, num_top, dim=-1)
        columns += [indices.double(), values.double()]
    return torch.cat(columns, dim=1)


def unpack(host: torch.Tensor, spans: list[tuple[int, int]]) -> list[list[dict[str, Any]]]:
    """Each span's (``num_positions``, ``num_top``) entries from ``pack``'s rows on the host."""
    rows: list[list[float]] = host.tolist()
    width = (host.shape[1] - 3) // 2 if host.dim() == 2 else 0
    out, at = [], 0
    for num_positions, num_top in spans:
        out.append([_entry(row, width, num_top) for row in rows[at : at + num_positions]])
        at += num_positions
    return out


def _entry(row: list[float], width: int, num_top: int) -> dict[str, Any]:
    ids, values = row[3 : 3 + num_top], row[3 + width : 3 + width + num_top]
    top = [{"token_id": int(t), "logprob": v} for t, v in zip(ids, values, strict=True)]
    return {"token_id": int(row[0]), "logprob": row[1], "rank": int(row[2]), "top": top}


class PromptScores:
    """The prompt logprobs computed so far of each request that asked, named as the
    sampled tokens' logprobs are (``TokenNames``)."""

    def __init__(self, names: TokenNames) -> None:
        self.names = names
        self._scored: dict[str, list[dict[str, Any]]] = {}

    def add(self, request_id: str, first_token: int, entries: list[dict[str, Any]]) -> None:
        """Scores of prompt tokens ``first_token`` on; those already held (a prompt
        computed again after a preemption) are kept once."""
        kept = self._scored.setdefault(request_id, [])
        skip = len(kept) + 1 - first_token
        if skip < 0:
            return  # after a gap: ``take`` refuses the request's scores
        kept.extend(self._named(entry) for entry in entries[skip:])

    def take(self, request_id: str, prompt_token_ids: list[int]) -> list[dict[str, Any]]:
        """The request's prompt logprobs: the first token named, its logprob None (it
        has none); PromptLogprobsGap when they do not cover the prompt."""
        kept = self._scored.pop(request_id, [])
        if len(kept) != len(prompt_token_ids) - 1:
            raise PromptLogprobsGap(
                f"internal error: prompt logprobs cover {len(kept)} of the prompt's "
                f"{len(prompt_token_ids) - 1} scored tokens"
            )
        first = self._named({"token_id": prompt_token_ids[0], "logprob": None, "top": []})
        return [first, *kept]

    def discard(self, request_id: str) -> None:
        self._scored.pop(request_id, None)

    def _named(self, entry: dict[str, Any]) -> dict[str, Any]:
        for item in (entry, *entry["top"]):
            text, raw = self.names[int(item["token_id"])]
            item["token"] = text
            if raw is not None:
                item["bytes"] = raw
        return entry


def add_step_scores(
    scores: PromptScores, sched_out: SchedulerOutput, runner_out: RunnerOutput
) -> None:
    """A step's prompt scores, to their requests (those still unfinished)."""
    items = [item for item in sched_out.scheduled if item.num_prompt_scores]
    for item, entries in zip(items, runner_out.prompt_logprobs, strict=True):
        if item.seq.status is not SeqStatus.FINISHED:
            scores.add(item.seq.request_id, item.start_pos + 1, entries)


def check_prompt_length(req: EngineRequest) -> None:
    """ValueError naming prompt_logprobs for a prompt past the tokens they are given for."""
    num_tokens = len(req.prompt_token_ids)
    if req.sampling.prompt_logprobs is not None and num_tokens > MAX_PROMPT_LOGPROBS_TOKENS:
        raise ValueError(
            f"request {req.request_id}: prompt_logprobs: the prompt is {num_tokens} tokens; "
            f"they are given for at most {MAX_PROMPT_LOGPROBS_TOKENS} prompt tokens a request"
        )
