"""A GGUF file's Q8_0 tensors load into the engine's int8 form from their blocks,
never widened whole to fp32: the same values as quantizing the dequantized tensor,
at a memory peak under the fp32 tensor's size (the round trip's is over it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from worker.engine.gguf_q8 import read_q8_0
from worker.engine.quantization import quantize_per_channel

# The big tensor of the memory test: 64 MiB in fp32, 16 MiB in int8.
BIG_ROWS, BIG_COLS = 4096, 4096
FP32_BYTES = BIG_ROWS * BIG_COLS * 4

# Run in a fresh process: the peak resident memory (VmHWM, reset first) over what
# the process held before loading, while ``read_q8_0`` or the fp32 round trip runs.
MEASURE = """
import json, sys
from pathlib import Path
import gguf.quants, torch
from worker.engine.gguf_q8 import read_q8_0
from worker.engine.quantization import quantize_per_channel

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
