"""A worker that cannot serve its model says so in one line, exits non-zero and takes
back what it registered; submits for that model are then refused with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from producer.client import Client
from shared.errors import ModelUnavailable
from shared.keys import Keys, model_tag
from shared.registry import mark_served
from shared.settings import Settings
from tests.integration.conftest import WorkerFactory
from tests.worker.engine.test_refusals import save_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def refused_at_start(start_worker: WorkerFactory, tmp_path: Path, model: str) -> str:
    """The worker's whole output once it has exited (non-zero)."""
    worker = start_worker("--model", model)
    assert worker.wait(timeout=300) == 1
    return (tmp_path / "worker-0.log").read_text()


def assert_nothing_left(connection: redis.Redis, model: str) -> None:
    keys = Keys()
    assert connection.zcard(keys.workers()) == 0
    assert not connection.keys(keys.worker("*"))
    assert not connection.exists(keys.served(model_tag(model)))


@pytest.mark.parametrize(
    ("model_type", "reason"),
    [
        ("deepseek_v3", "multi-head latent attention (MLA)"),
        ("llama4_text", "chunked attention"),
        ("nemotron_h", "recurrent or convolution state"),  # a hybrid without a description
    ],
)
def test_an_architecture_the_engine_cannot_run_is_refused_in_one_line_and_never_served(
    real_redis: redis.Redis,
    start_worker: WorkerFactory,
    tmp_path: Path,
    model_type: str,
    reason: str,
) -> None:
    model = str(save_config(tmp_path / model_type, model_type))
    output = refused_at_start(start_worker, tmp_path, model)
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and model_type in errors[0] and reason in errors[0], output
    assert "Traceback" not in output and "serving" not in output, output
    assert_nothing_left(real_redis, model)
    client = Client(connection=real_redis, settings=Settings())
    with pytest.raises(ModelUnavailable, match=r"MLA|chunked|state") as refused:
        client.submit("hi", model=model, max_tokens=4)
    assert model_type in str(refused.value)


def test_a_missing_model_path_is_refused_and_its_submits_name_the_reason_until_a_worker_serves(
    real_redis: redis.Redis, start_worker: WorkerFactory, tmp_path: Path
) -> None:
    model = str(tmp_path / "no-such-model")
    output = refused_at_start(start_worker, tmp_path, model)
    assert output.strip() == f"error: model {model}: no such file or directory", output
    assert_nothing_left(real_redis, model)
    # Refused even where unknown models may queue: this one is known not to load.
    client = Client(connection=real_redis, settings=Settings(require_known_model=False))
    with pytest.raises(ModelUnavailable, match="no such file or directory"):
        client.submit("hi", model=model, max_tokens=4)
    # A worker that comes up for the model (here its marker, as a loading worker sets
    # it) lifts the refusal: requests queue for it again.
    pipe = real_redis.pipeline()
    mark_served(pipe, Keys(), Settings(), model)
    pipe.execute()
    assert client.submit("hi", model=model, max_tokens=4).id
