"""What the speculative decoding tests share: the engines, prompts, and readers."""

from __future__ import annotations

from typing import Any

import pytest

from tests.worker.engine.conftest import EngineFactory
from tests.worker.engine.factories import make_request
from worker.engine import Engine, EngineRequest, RequestOutput
from worker.engine.speculative.config import SpeculativeConfig

# Speculating at every batch size, so that tests of batches exercise it.
SPECULATIVE = SpeculativeConfig(num_speculative_tokens=4, disable_by_batch_size=64)

# Prompts whose answers copy their input (n-gram proposals get accepted) ...
REPEATING = (
    "Repeat this list exactly, twice: apples, bananas, cherries, dates, elderberries, figs.",
    "Rename the variable x to value in this code and print the code:\n\n"
    "def area(x):\n    return x * x * 3.14\n",
    "Copy this sentence word for word: The quick brown fox jumps over the lazy dog.",
)
# ... and prompts whose answers do not.
NOVEL = ("Write one line about the sea.", "Name a famous city.")


Outputs = dict[str, list[RequestOutput]]  # by request id


def speculative_engine(make_engine: EngineFactory) -> Engine:
    return make_engine(speculative_config=SPECULATIVE)


def chat(engine: Engine, text: str) -> list[int]:
    return engine.encode_chat([{"role": "user", "content": text}])


def tokens_of(outputs: list[RequestOutput]) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def logprobs_of(outputs: list[RequestOutput]) -> list[float]:
    return [entry["logprob"] for out in outputs for entry in out.logprobs or ()]


def run_all(engine: Engine, requests: list[EngineRequest]) -> dict[str, list[RequestOutput]]:
    return engine.generate(requests)


def requests_for(prompts: list[list[int]], **kwargs: Any) -> list[EngineRequest]:
    return [make_request(p, request_id=f"p{i}", **kwargs) for i, p in enumerate(prompts)]


def same_as_without(
    plain: Engine, spec: Engine, prompts: list[list[int]], **kwargs: Any
) -> tuple[Outputs, Outputs, int, int]:
    """``plain``'s and ``spec``'s outputs of ``prompts``, checked equal token for token
    (and logprob for logprob, within 2e-3), and the draft tokens ``spec`` proposed and
    kept."""
    expected = plain.generate(requests_for(prompts, **kwargs))
    before = spec.stats()
    got = spec.generate(requests_for(prompts, **kwargs))
    for request_id, outputs in expected.items():
        assert tokens_of(got[request_id]) == tokens_of(outputs)
        assert logprobs_of(got[request_id]) == pytest.approx(logprobs_of(outputs), abs=2e-3)
    return (expected, got, *accepted_since(spec, before))


def accepted_since(engine: Engine, before: dict[str, float]) -> tuple[int, int]:
    """Draft tokens proposed and kept since ``before`` (an earlier ``stats()``)."""
    now = engine.stats()
    proposed = now["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"]
    kept = now["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
    return int(proposed), int(kept)
