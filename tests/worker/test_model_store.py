"""Where a worker's model comes from: the default, a directory, a ``.gguf`` file
(converted once into a cache directory of its own), or a hub name."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker import model_store
from worker.engine.errors import ModelLoadError
from worker.model_store import ModelNotFound, find_default_gguf, resolve_model


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(model_store, "cache_dir", lambda: tmp_path / "cache")
    return tmp_path / "cache"


def test_a_gguf_file_converts_once_into_a_cache_directory_of_its_own(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    converted: list[tuple[Path, Path]] = []

    def convert(gguf: Path, target: Path) -> None:
        converted.append((gguf, target))
        target.mkdir(parents=True)

    monkeypatch.setattr(model_store, "convert_gguf", convert)
    gguf = tmp_path / "tiny-q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    first = resolve_model(str(gguf))
    assert first == resolve_model(str(gguf))  # the second time reads the cache
    assert converted == [(gguf, first)]
    assert isinstance(first, Path) and first.parent == cache
    assert first.name.startswith("tiny-q8_0-")


def test_the_default_models_own_gguf_file_is_the_default_model() -> None:
    assert resolve_model(str(find_default_gguf())) == resolve_model("SmolLM2-135M-Instruct")


def test_a_missing_path_is_an_error_and_a_hub_name_passes_through(tmp_path: Path) -> None:
    for missing in (str(tmp_path / "nothing"), "./nothing", "~/nothing", "x.gguf", "a/b/c"):
        with pytest.raises(ModelNotFound, match="no such file or directory") as raised:
            resolve_model(missing)
        assert isinstance(raised.value, ModelLoadError)
    assert resolve_model("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert resolve_model("gpt2") == "gpt2"
    assert resolve_model(str(tmp_path)) == tmp_path
