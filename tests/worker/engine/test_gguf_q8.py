"""A GGUF file's Q8_0 tensors load into the engine's int8 form from their blocks,
never widened whole to fp32: the same values as quantizing the dequantized tensor,
at a memory peak under the fp32 tensor's size (the round trip's is over it)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shared.models import SamplingParams
from tests.worker.engine.gguf_models import write_q8_0_model
from tests.worker.engine.tiny_models import SPECS_BY_NAME, build_model, make_config
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.engine.gguf_q8 import GgufInt8, read_q8_0
from worker.engine.models import family_for
from worker.engine.models.decoder import Attention, DecoderModel
from worker.engine.models.layers import GatedMLP, Projection
from worker.engine.quantization import Int8Projection, quantize_forward, quantize_per_channel
from worker.model_store import GGUF_SOURCE_FILE, gguf_source

# The big tensor of the memory test: 64 MiB in fp32, 16 MiB in int8.
BIG_ROWS, BIG_COLS = 4096, 4096
FP32_BYTES = BIG_ROWS * BIG_COLS * 4

# Run in a fresh process: the peak resident memory (VmHWM, reset first) over what
# the process held before loading, while ``read_q8_0`` or the fp32 round trip runs.
MEASURE = """
import json, sys
from pathlib import Path
import gguf.quants, torch
from shared.models import SamplingParams
from tests.worker.engine.gguf_models import write_q8_0_model
from tests.worker.engine.tiny_models import SPECS_BY_NAME, build_model, make_config
from worker.engine import Engine, EngineConfig, EngineRequest
from worker.engine.gguf_q8 import GgufInt8, read_q8_0
from worker.engine.models import family_for
from worker.engine.models.decoder import Attention, DecoderModel
from worker.engine.models.layers import GatedMLP, Projection
from worker.engine.quantization import Int8Projection, quantize_forward, quantize_per_channel
from worker.model_store import GGUF_SOURCE_FILE, gguf_source

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

def round_trip(path):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    reader = GGUFReader(path)
    return {t.name: quantize_per_channel(torch.from_numpy(dequantize(t.data, t.tensor_type)))
            for t in reader.tensors}

path, how = sys.argv[1], sys.argv[2]
quantize_per_channel(torch.randn(64, 64))  # the ops' one-time set-up, not the tensor's
Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to what is resident now
before = status("VmRSS")
weights = read_q8_0(path) if how == "direct" else round_trip(path)
print(json.dumps({"peak_bytes": status("VmHWM") - before, "num_tensors": len(weights)}))
"""


# The loader's quantizing of a model from a Q8_0 GGUF (``GgufInt8`` then
# ``quantize_forward``), or of the same model's fp32 weights, in a fresh process; the
# peak over what it held with the model loaded.
MEASURE_LOAD = """
import json, sys
from pathlib import Path
import torch
from tests.worker.engine.gguf_models import write_q8_0_model
from tests.worker.engine.tiny_models import SPECS_BY_NAME, build_model, make_config
from worker.engine.gguf_q8 import GgufInt8
from worker.engine.models import family_for
from worker.engine.models.decoder import DecoderModel
from worker.engine.quantization import quantize_forward, quantize_per_channel

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

path, how = Path(sys.argv[1]), sys.argv[2]
model = build_model(make_config(SPECS_BY_NAME["llama"], **json.loads(sys.argv[3])))
write_q8_0_model(model, path)
forward = DecoderModel(model, family_for(model.config))
quantize_per_channel(torch.randn(64, 64))  # the ops' one-time set-up
Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to what is resident now
before = status("VmRSS")
prequantized = GgufInt8(path, model).weight_for if how == "direct" else None
quantize_forward(forward, "int8", "big", prequantized)
print(json.dumps({"peak_bytes": status("VmHWM") - before}))
"""
# One layer whose fused gate/up projection is 64 MiB in fp32 (16 MiB in int8).
BIG_MODEL = {
    "hidden_size": 1024,
    "intermediate_size": 8192,
    "num_hidden_layers": 1,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
BIG_GATE_UP_FP32_BYTES = 2 * 8192 * 1024 * 4


def write_q8_0_gguf(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A GGUF file holding ``tensors`` (float32 ``[rows, cols]``) quantized to Q8_0."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    writer = GGUFWriter(str(path), arch="llama")
    for name, values in tensors.items():
        blocks = quantize(values, GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, blocks, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_q8_0_tensors_read_as_quantizing_their_dequantized_values_would(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    generator = np.random.default_rng(0)
    tensors = {
        "blk.0.attn_q.weight": generator.normal(size=(96, 64)).astype(np.float32),
        "blk.0.ffn_down.weight": (generator.normal(size=(40, 320)) * 0.02).astype(np.float32),
    }
    path = tmp_path / "tiny-q8_0.gguf"
    write_q8_0_gguf(path, tensors)
    loaded = read_q8_0(path)
    assert set(loaded) == set(tensors)
    for name, values in tensors.items():
        blocks = quantize(values, GGMLQuantizationType.Q8_0)
        dequantized = torch.from_numpy(dequantize(blocks, GGMLQuantizationType.Q8_0))
        expected = quantize_per_channel(dequantized)
        assert torch.equal(loaded[name].values, expected.values)
        assert torch.equal(loaded[name].scales, expected.scales)
        # Within a scale step of the original weights.
        step = loaded[name].scales.float()[:, None]
        assert ((loaded[name].dequantize() - torch.from_numpy(values)).abs() <= step).all()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_q8_0_tensor_loads_without_its_fp32_size_in_memory(tmp_path: Path) -> None:
    generator = np.random.default_rng(1)
    values = generator.normal(size=(BIG_ROWS, BIG_COLS)).astype(np.float32)
    path = tmp_path / "big-q8_0.gguf"
    write_q8_0_gguf(path, {"blk.0.ffn_up.weight": values})
    del values
    direct, round_trip = measure(path, "direct"), measure(path, "round-trip")
    assert direct["num_tensors"] == round_trip["num_tensors"] == 1
    # The int8 result (a quarter of fp32), a chunk of rows and the allocator's slack
    # (measured about 0.45 of fp32 in all); never the fp32 tensor.
    assert direct["peak_bytes"] < FP32_BYTES * 3 / 4
    # The round trip through fp32 holds the whole widened tensor (and more) at once.
    assert round_trip["peak_bytes"] > FP32_BYTES


def measure(path: Path, how: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), how],
        capture_output=True,
        text=True,
        check=True,
        timeout=500,
    )
    result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _tiny_llama(**changes: Any) -> Any:
    return build_model(make_config(SPECS_BY_NAME["llama"], **changes))


def _projections(forward: DecoderModel) -> list[Projection]:
    found: list[Projection] = [forward.lm_head]
    for layer in forward.layers:
        assert isinstance(layer.mixer, Attention) and isinstance(layer.mlp, GatedMLP)
        found += [layer.mixer.qkv, layer.mixer.o, layer.mlp.gate_up, layer.mlp.down]
    return found


def test_a_q8_0_ggufs_projections_take_its_blocks_as_quantizing_its_values_would(
    tmp_path: Path,
) -> None:
    """Fused q/k/v (its q and k rows permuted in the file) and gate/up included."""
    direct_model = _tiny_llama()
    path = tmp_path / "tiny-llama-q8_0.gguf"
    assert write_q8_0_model(direct_model, path) > 0
    round_trip_model = _tiny_llama()
    round_trip_model.load_state_dict(direct_model.state_dict())
    family = family_for(direct_model.config)
    assert family is not None
    direct, round_trip = DecoderModel(direct_model, family), DecoderModel(round_trip_model, family)
    from_file = GgufInt8(path, direct_model)
    read = {p.weight.data_ptr(): from_file.weight_for(p.weight) for p in _projections(direct)}
    assert all(int8 is not None for int8 in read.values())  # each from the file's blocks
    quantize_forward(direct, "int8", "tiny", prequantized=lambda w: read[w.data_ptr()])
    quantize_forward(round_trip, "int8", "tiny")
    for got, expected in zip(_projections(direct), _projections(round_trip), strict=True):
        assert isinstance(got, Int8Projection) and isinstance(expected, Int8Projection)
        assert torch.equal(got.int8.values, expected.int8.values)
        assert torch.equal(got.int8.scales, expected.int8.scales)
        assert torch.equal(got.weight, expected.weight)


def test_a_gguf_whose_rows_are_not_its_models_is_quantized_from_the_model(
    tmp_path: Path,
) -> None:
    model = _tiny_llama()
    path = tmp_path / "tiny-llama-q8_0.gguf"
    write_q8_0_model(model, path)
    other = _tiny_llama()  # other weights: none of the file's tensors match
    family = family_for(other.config)
    assert family is not None
    forward = DecoderModel(other, family)
    from_file = GgufInt8(path, other)
    assert all(from_file.weight_for(p.weight) is None for p in _projections(forward))


def test_an_int8_engine_on_a_converted_q8_0_gguf_reads_its_blocks(
    tmp_path: Path, model_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The runner finds the GGUF a model directory was converted from and serves its
    Q8_0 blocks; the same directory without that record quantizes its fp32 weights,
    to the same weights and the same greedy tokens."""
    from transformers import AutoTokenizer

    model = _tiny_llama()
    gguf_path = tmp_path / "tiny-llama-q8_0.gguf"
    num_tensors = write_q8_0_model(model, gguf_path)
    outs = {}
    for name in ("direct", "round-trip"):
        model_dir = tmp_path / name
        model.save_pretrained(model_dir)
        AutoTokenizer.from_pretrained(model_path).save_pretrained(model_dir)
        if name == "direct":
            (model_dir / GGUF_SOURCE_FILE).write_text(str(gguf_path))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="worker.engine.quantization"):
            engine = Engine(EngineConfig(model=str(model_dir), quantization="int8", kv_cache_mib=8))
        read = re.search(r"(\d+) read from a GGUF file's Q8_0 blocks", caplog.text)
        assert read is not None
        outs[name] = (int(read.group(1)), engine)
    (num_direct, direct), (num_round_trip, round_trip) = outs["direct"], outs["round-trip"]
    assert num_round_trip == 0
    # Each layer's q, k and v make one projection, gate and up another; the embedding
    # is the file's one tensor no projection reads (the model's lm_head is its own).
    num_layers = model.config.num_hidden_layers
    assert num_direct == num_tensors - 1 - 3 * num_layers
    assert isinstance(direct.runner.forward_fn, DecoderModel)
    assert isinstance(round_trip.runner.forward_fn, DecoderModel)
    pairs = zip(
        _projections(direct.runner.forward_fn),
        _projections(round_trip.runner.forward_fn),
        strict=True,
    )
    for got, expected in pairs:
        assert isinstance(got, Int8Projection) and isinstance(expected, Int8Projection)
        assert torch.equal(got.int8.values, expected.int8.values)
    sampling = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    tokens = [
        engine.generate([EngineRequest("r", [5, 6, 7, 8, 9], sampling)])["r"]
        for engine in (direct, round_trip)
    ]
    assert [t.new_token_ids for t in tokens[0]] == [t.new_token_ids for t in tokens[1]]


def test_a_converted_directory_names_its_gguf_while_that_file_is_there(tmp_path: Path) -> None:
    gguf_path = tmp_path / "m.gguf"
    gguf_path.write_bytes(b"GGUF")
    model_dir = tmp_path / "converted"
    model_dir.mkdir()
    assert gguf_source(model_dir) is None
    (model_dir / GGUF_SOURCE_FILE).write_text(str(gguf_path))
    assert gguf_source(model_dir) == gguf_path
    gguf_path.unlink()
    assert gguf_source(model_dir) is None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quantizing_a_model_from_its_q8_0_gguf_never_holds_a_weight_in_fp32(
    tmp_path: Path,
) -> None:
    peaks = {}
    for how in ("direct", "round-trip"):
        path = str(tmp_path / f"{how}.gguf")
        done = subprocess.run(
            [sys.executable, "-c", MEASURE_LOAD, path, how, json.dumps(BIG_MODEL)],
            capture_output=True,
            text=True,
            check=True,
            timeout=500,
        )
        peaks[how] = json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"]
    # Each tensor is read from the file as its projection asks for it: the gate and up
    # halves in int8, the fused one built from them, its packed copy and the
    # allocator's slack (measured 41 MiB): never a weight in fp32. Reading the whole
    # file's int8 tensors first measured 57-70 MiB, too near the 64 MiB bound.
    assert peaks["direct"] < BIG_GATE_UP_FP32_BYTES
    # Quantizing the fp32 weights widens the largest one whole, twice over (measured
    # 150 MiB).
    assert peaks["round-trip"] > 2 * BIG_GATE_UP_FP32_BYTES > 2 * peaks["direct"]
