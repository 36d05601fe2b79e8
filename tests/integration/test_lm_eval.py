"""lm-eval's ``local-completions`` against a gateway process and a worker on the default
model: a multiple-choice task kept in the repository (``lm_eval_task/``) runs, nothing is
fetched from a hub, and each choice's loglikelihood equals transformers' own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from shared.settings import DEFAULT_MODEL
from tests.prompt_reference import continuation_logprob

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TASK_DIR = Path(__file__).with_name("lm_eval_task")
# A choice's loglikelihood sums a few tokens' logprobs, each within 1e-4 of transformers'.
TOLERANCE = 1e-3


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No hub: lm-eval and transformers read the model's directory and the task's file."""
    import huggingface_hub.constants

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_local_completions_scores_each_choice_as_transformers_does(
    openai_client: openai.OpenAI, default_model_dir: Path, offline: None
) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    base_url = str(openai_client.base_url).rstrip("/")
    results = simple_evaluate(
        model="local-completions",
        model_args={
            "model": DEFAULT_MODEL,
            "base_url": f"{base_url}/completions",
            "tokenizer_backend": "huggingface",
            "tokenizer": str(default_model_dir),
            "tokenized_requests": True,
            "num_concurrent": 1,
            "max_retries": 1,
        },
        tasks=["tokenq_capitals"],
        task_manager=TaskManager(include_path=str(TASK_DIR), include_defaults=False),
        log_samples=True,
    )
    assert results is not None
    samples = results["samples"]["tokenq_capitals"]
    assert len(samples) == 4
    tokenizer: Any = AutoTokenizer.from_pretrained(default_model_dir)
    for sample in samples:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"], strict=True):
            got = _loglikelihood(resp)
            want = _reference(default_model_dir, tokenizer, context, continuation)
            assert got == pytest.approx(want, abs=TOLERANCE)
    assert 0.0 <= results["results"]["tokenq_capitals"]["acc,none"] <= 1.0


def _loglikelihood(resp: Any) -> float:
    """A choice's loglikelihood from its logged response, ``[(loglikelihood, is_greedy)]``."""
    while isinstance(resp, list | tuple) and len(resp) == 1:
        resp = resp[0]
    return float(resp[0])


def _reference(model_dir: Path, tokenizer: Any, context: str, continuation: str) -> float:
    """The choice's loglikelihood from transformers, its tokens split as lm-eval splits
    them (trailing spaces of the context move to the continuation)."""
    num_spaces = len(context) - len(context.rstrip())
    if num_spaces:
        context, continuation = context[:-num_spaces], context[-num_spaces:] + continuation
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    num_context = len(tokenizer(context, add_special_tokens=False)["input_ids"])
    return continuation_logprob(model_dir, whole[:num_context], whole[num_context:])
