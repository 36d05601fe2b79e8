"""`tokenq up` runs what batches need: a batch made with the unmodified ``openai`` SDK
against a fresh `tokenq up` completes with nothing else started by hand."""

from __future__ import annotations

from pathlib import Path

import openai
import orjson
import pytest

from shared.settings import DEFAULT_MODEL
from tests.integration.test_up_signals import up_serving
from tests.producer.batch.procs import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BATCH_TIMEOUT_S = 240.0


def test_a_batch_completes_under_tokenq_up_alone(tmp_path: Path, default_model_dir: Path) -> None:
    with up_serving(tmp_path, default_model_dir) as (_, output):
        client = openai.OpenAI(base_url=f"{output.gateway_url()}/v1", api_key="none")
        body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Hi."}]}
        line = {"custom_id": "hi", "method": "POST", "url": "/v1/chat/completions"}
        data = orjson.dumps({**line, "body": {**body, "max_tokens": 4}})
        upload = client.files.create(file=("in.jsonl", data), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_for(
            lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b,
            BATCH_TIMEOUT_S,
            "the batch to complete under tokenq up",
        )
        assert done.output_file_id is not None
        (answer,) = client.files.content(done.output_file_id).read().splitlines()
        assert orjson.loads(answer)["response"]["status_code"] == 200
