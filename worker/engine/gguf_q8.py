"""A GGUF file's Q8_0 tensors read straight into the engine's int8 form.

Q8_0 stores a weight in blocks of 32 int8 values with one fp16 scale each
(``d * q``); the engine's kernel takes one scale per output row
(``worker.engine.quantization``). Each tensor is read from the file a few rows at
a time and requantized per row from those rows' blocks, so the whole tensor never
exists in fp32: beside the int8 result (a quarter of the fp32 size) only one chunk
of rows is ever widened. The values are those that
quantizing the fully dequantized tensor would give, since each row's scale depends
on that row alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import torch

from worker.engine.errors import ModelLoadError
from worker.engine.quantization import KERNEL_DTYPE, Int8Weight, quantize_per_channel

BLOCK_VALUES = 32  # int8 values per Q8_0 block
BLOCK_BYTES = 2 + BLOCK_VALUES  # its fp16 scale, then the values
CHUNK_VALUES = 1 << 18  # values widened to fp32 at a time


def read_q8_0(path: str | Path) -> dict[str, Int8Weight]:
    """Every two-dimensional Q8_0 tensor of the GGUF file at ``path``, by its GGUF name
    (``blk.0.attn_q.weight``...), in int8 with a scale per row."""
    from gguf import GGMLQuantizationType, GGUFReader

    try:
        reader = GGUFReader(path)  # maps the file; only its header is read here
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot read this GGUF file: {e}") from e
    weights = {}
    with open(path, "rb") as file:
        for tensor in reader.tensors:
            if tensor.tensor_type == GGMLQuantizationType.Q8_0 and len(tensor.shape) == 2:
                num_cols, num_rows = (int(n) for n in tensor.shape)  # innermost first
                weights[tensor.name] = read_tensor(file, tensor.data_offset, num_rows, num_cols)
    return weights


def read_tensor(file: BinaryIO, offset: int, num_rows: int, num_cols: int) -> Int8Weight:
    """The Q8_0 tensor ``[num_rows, num_cols]`` at ``offset`` in ``file``, read and
    requantized a chunk of rows at a time (plain reads: no page of the file stays
    mapped in this process)."""
    if num_cols % BLOCK_VALUES:
        raise ModelLoadError(f"a Q8_0 tensor of {num_cols} columns (not blocks of 32)")
    row_bytes = num_cols // BLOCK_VALUES * BLOCK_BYTES
    chunk_rows = max(1, CHUNK_VALUES // num_cols)
    values = torch.empty((num_rows, num_cols), dtype=torch.int8)
    scales = torch.empty(num_rows, dtype=KERNEL_DTYPE)
    for start in range(0, num_rows, chunk_rows):
        count = min(chunk_rows, num_rows - start)
        file.seek(offset + start * row_bytes)
        raw = bytearray(file.read(count * row_bytes))
        if len(raw) != count * row_bytes:
            raise ModelLoadError(f"the GGUF file ends inside a tensor (at row {start})")
        part = quantize_per_channel(widened(torch.frombuffer(raw, dtype=torch.uint8), num_cols))
        values[start : start + count] = part.values
        scales[start : start + count] = part.scales
    return Int8Weight(values, scales)


def widened(raw: torch.Tensor, num_cols: int) -> torch.Tensor:
    """Rows of Q8_0 bytes as fp32 values ``d * q`` (exact: an fp16 times an int8)."""
    blocks = raw.view(-1, num_cols // BLOCK_VALUES, BLOCK_BYTES)
    scale = blocks[..., :2].contiguous().view(torch.float16).float()
    quants = blocks[..., 2:].contiguous().view(torch.int8).float()
    return (quants * scale).view(-1, num_cols)
