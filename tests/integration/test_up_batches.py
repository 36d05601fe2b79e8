"""`tokenq up` runs what batches need: the batch example of docs/how-to/batches.md
(the unmodified ``openai`` SDK: upload, create, poll, download) completes against a
fresh `tokenq up` with nothing else started by hand."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_up_signals import up_serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DOC = Path(__file__).parents[2] / "docs" / "how-to" / "batches.md"
DOC_URL = "http://127.0.0.1:8000/v1"


def doc_example() -> str:
    found = re.search(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert found is not None, f"no python example in {DOC}"
    return found.group(1)


def test_the_docs_batch_completes_under_tokenq_up_alone(
    tmp_path: Path, default_model_dir: Path
) -> None:
    example = doc_example()
    assert DOC_URL in example
    with up_serving(tmp_path, default_model_dir) as (_, output):
        code = example.replace(DOC_URL, f"{output.gateway_url()}/v1")
        printed = io.StringIO()
        names: dict[str, Any] = {}
        with contextlib.redirect_stdout(printed):
            exec(compile(code, str(DOC), "exec"), names)
    batch = names["batch"]
    assert (batch.status, batch.error_file_id, batch.metadata) == (
        "completed",
        None,
        {"job": "nightly-eval"},
    )
    answers = printed.getvalue().splitlines()
    assert [line.split(" ", 1)[0] for line in answers] == ["q0", "q1"]
    assert all(len(line.split(" ", 1)) == 2 for line in answers)  # each with its answer
