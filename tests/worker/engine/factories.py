"""Factories for engine tests: requests, workloads."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from shared.models import SamplingParams
from worker.engine import EngineRequest

WORKLOADS = Path(__file__).resolve().parents[3] / "bench" / "workloads"
_ids = itertools.count()


def make_request(
    prompt_token_ids: list[int],
    request_id: str | None = None,
    **kwargs: Any,
) -> EngineRequest:
    """A request with greedy sampling unless ``sampling`` or sampling fields say otherwise."""
    sampling_fields = {k: kwargs.pop(k) for k in list(kwargs) if k in SamplingParams.model_fields}
    sampling = kwargs.pop("sampling", None) or SamplingParams(
        **{"temperature": 0.0, **sampling_fields}
    )
    rid = request_id or f"req-{next(_ids)}"
    return EngineRequest(rid, list(prompt_token_ids), sampling, **kwargs)


def load_workload(name: str) -> list[dict[str, Any]]:
    with open(WORKLOADS / name) as f:
        return [json.loads(line) for line in f if line.strip()]
