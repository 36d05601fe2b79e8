"""Fixtures for the engine tests: the model, engine factories, request factories,
and greedy references from transformers' own ``generate``."""

from __future__ import annotations

import gc
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.worker.engine.factories import load_workload
from tests.worker.engine.reference import Reference, greedy_references
from tests.worker.engine.tiny_models import TinySpec, save_tiny
from worker.engine import Engine, EngineConfig
from worker.engine.quantization import w8a8_available


@pytest.fixture(scope="session")
def model_path() -> str:
    """The default model (converted from its GGUF package on first use)."""
    from worker.model_store import resolve_model

    return str(resolve_model("SmolLM2-135M-Instruct"))


EngineFactory = Callable[..., Engine]


# Engines kept loaded at once: each holds the model and its KV cache, and the whole
# suite runs in one process on a 24 GiB machine, so the least recently used is let go
# (loaded again if a later test asks for it).
MAX_CACHED_ENGINES = 3

NEEDS_W8A8 = pytest.mark.skipif(
    not w8a8_available(), reason="w8a8 needs fbgemm and VNNI: refused on this CPU"
)


@pytest.fixture(scope="session")
def make_engine(model_path: str) -> EngineFactory:
    """Engines by configuration, loaded once and shared while they stay among the
    most recently used (each test leaves its engine with nothing in flight)."""
    cache: OrderedDict[tuple[tuple[str, Any], ...], Engine] = OrderedDict()

    def make(**overrides: Any) -> Engine:
        key = tuple(sorted(overrides.items()))
        if key not in cache:
            while len(cache) >= MAX_CACHED_ENGINES:
                cache.popitem(last=False)
                gc.collect()
            cache[key] = Engine(EngineConfig(model=model_path, **overrides))
        cache.move_to_end(key)
        engine = cache[key]
        assert not engine.has_unfinished_requests(), "an earlier test left requests behind"
        return engine

    return make


TinyModels = Callable[[TinySpec], Path]


@pytest.fixture(scope="session")
def tiny_models(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """Each tiny spec's model (``tiny_models``), saved once per session."""
    out = tmp_path_factory.mktemp("tiny-models")
    saved: dict[str, Path] = {}

    def get(spec: TinySpec) -> Path:
        if spec.name not in saved:
            saved[spec.name] = save_tiny(spec, out, model_path)
        return saved[spec.name]

    return get


@pytest.fixture
def engine(make_engine: EngineFactory) -> Iterator[Engine]:
    engine = make_engine()
    yield engine
    _drain(engine)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Torch on one thread for a test of tiny models: they gain nothing from threads,
    and lose much to a busy machine's contention for its cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _drain(engine: Engine) -> None:
    for seq in (*engine.scheduler.running, *engine.scheduler.waiting):
        engine.abort_request(seq.request_id)
    engine.step()


@pytest.fixture(scope="session")
def mixed32_references(model_path: str) -> list[Reference]:
    return greedy_references(model_path, load_workload("mixed32.jsonl"))


@pytest.fixture(scope="session")
def tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that runs the real model is slow (``make test-fast`` leaves it out). A
    test marked ``cuda`` needs a GPU: on a machine without one it is deselected (and
    counted as such in the summary), not run to fail."""
    for item in items:
        if "make_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    needs_gpu = [item for item in items if item.get_closest_marker("cuda")]
    if needs_gpu:
        config.hook.pytest_deselected(items=needs_gpu)
        items[:] = [item for item in items if not item.get_closest_marker("cuda")]
