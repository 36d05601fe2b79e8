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
from typing import Any, BinaryIO

import torch

from worker.engine.errors import ModelLoadError
from worker.engine.quantization import KERNEL_DTYPE, Int8Weight, quantize_per_channel

BLOCK_VALUES = 32  # int8 values per Q8_0 block
BLOCK_BYTES = 2 + BLOCK_VALUES  # its fp16 scale, then the values
CHUNK_VALUES = 1 << 18  # values widened to fp32 at a time


def q8_0_tensors(path: str | Path) -> dict[str, tuple[int, int, int]]:
    """Where each two-dimensional Q8_0 tensor of the GGUF file at ``path`` lies, by its
    GGUF name (``blk.0.attn_q.weight``...): its offset, rows and columns. Only the
    file's header is read."""
    from gguf import GGMLQuantizationType, GGUFReader

    try:
        reader = GGUFReader(path)  # maps the file; only its header is read here
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot read this GGUF file: {e}") from e
    found = {}
    for tensor in reader.tensors:
        if tensor.tensor_type == GGMLQuantizationType.Q8_0 and len(tensor.shape) == 2:
            num_cols, num_rows = (int(n) for n in tensor.shape)  # innermost first
            found[tensor.name] = (int(tensor.data_offset), num_rows, num_cols)
    return found


def read_q8_0(path: str | Path) -> dict[str, Int8Weight]:
    """Every two-dimensional Q8_0 tensor of the GGUF file at ``path``, by its GGUF name,
    in int8 with a scale per row."""
    with open(path, "rb") as file:
        return {name: read_tensor(file, *where) for name, where in q8_0_tensors(path).items()}


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


def read_architecture(path: str | Path) -> str:
    """The GGUF file's ``general.architecture`` (``llama``, ``qwen2``...)."""
    from gguf import GGUFReader

    field = GGUFReader(path).get_field("general.architecture")
    if field is None:
        raise ModelLoadError(f"{path}: this GGUF file names no architecture")
    return str(field.contents())


class GgufInt8:
    """The int8 form of a loaded model's weights, read from the GGUF file the model was
    converted from (``worker.model_store.gguf_source``) where that file holds them in
    Q8_0: :meth:`weight_for` answers for a projection's weight, fused or not.

    A parameter matches its GGUF tensor by name (gguf's own map for the architecture),
    in the row order the conversion gave it (llama.cpp permutes a llama's q and k rows,
    and transformers permutes them back): the candidate orders are tried on a few rows
    against quantizing the parameter's own values, which the conversion made exactly
    ``d * q``. A parameter that matches no order, or whose dtype is not the file's
    exact values, is quantized from its own values as any other checkpoint's."""

    def __init__(self, path: str | Path, model: Any) -> None:
        import gguf

        config = model.config.get_text_config()
        arch = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}.get(
            read_architecture(path)
        )
        self.path = Path(path)
        self.tensors = q8_0_tensors(path)  # read one at a time, as each is asked for
        self.head_counts = {
            int(config.num_attention_heads),
            int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads),
        }
        name_map = (
            None if arch is None else gguf.get_tensor_name_map(arch, config.num_hidden_layers)
        )
        # Each parameter's storage -> (its offset in it, its GGUF tensor, the parameter).
        self.parts: dict[int, list[tuple[int, str, torch.Tensor]]] = {}
        for hf_name, param in model.named_parameters():
            gguf_name = None if name_map is None else name_map.get_name(hf_name, (".weight",))
            if gguf_name in self.tensors and param.dim() == 2:
                storage = param.untyped_storage().data_ptr()
                self.parts.setdefault(storage, []).append(
                    (param.storage_offset(), gguf_name, param.detach())
                )

    def weight_for(self, weight: torch.Tensor) -> Int8Weight | None:
        """``weight``'s int8 form from the file's blocks, or None where the file does
        not hold every row of it in Q8_0."""
        parts = sorted(self.parts.get(weight.untyped_storage().data_ptr(), []), key=_offset)
        num_cols = weight.shape[1]
        inside = [p for p in parts if _rows_of(p, weight) is not None]
        if sum(p[2].shape[0] for p in inside) != weight.shape[0] or not inside:
            return None
        pieces = [self._matched(name, param) for _, name, param in inside]
        if any(piece is None for piece in pieces) or inside[0][0] != weight.storage_offset():
            return None
        found = [p for p in pieces if p is not None]
        if any(p.values.shape[1] != num_cols for p in found):
            return None
        if len(found) == 1:
            return found[0]
        return Int8Weight(
            torch.cat([p.values for p in found]), torch.cat([p.scales for p in found])
        )

    def _matched(self, name: str, param: torch.Tensor) -> Int8Weight | None:
        where = self.tensors.pop(name, None)  # read once: let go once it is placed
        if where is None or where[1:] != tuple(param.shape):
            return None
        with open(self.path, "rb") as file:
            int8 = read_tensor(file, *where)
        sample = _sample_rows(param.shape[0])
        expected = quantize_per_channel(param[sample])
        for order in _row_orders(param.shape[0], self.head_counts):
            rows = sample if order is None else order[sample]
            if torch.equal(int8.values[rows], expected.values) and torch.equal(
                int8.scales[rows], expected.scales
            ):
                return int8 if order is None else Int8Weight(int8.values[order], int8.scales[order])
        return None


def _offset(part: tuple[int, str, torch.Tensor]) -> int:
    return part[0]


def _rows_of(part: tuple[int, str, torch.Tensor], weight: torch.Tensor) -> int | None:
    """Where ``part`` starts among ``weight``'s rows, None when it lies outside it."""
    offset, _, param = part
    start = offset - weight.storage_offset()
    num_cols = weight.shape[1]
    if start < 0 or start % num_cols or start // num_cols + param.shape[0] > weight.shape[0]:
        return None
    return start // num_cols


def _sample_rows(num_rows: int, num_samples: int = 9) -> torch.Tensor:
    """A few rows spread over the tensor, row 1 among them (a head permutation moves it)."""
    spread = torch.linspace(0, num_rows - 1, num_samples).long()
    rows: torch.Tensor = torch.unique(torch.cat([spread, torch.tensor([min(1, num_rows - 1)])]))
    return rows


def _row_orders(num_rows: int, head_counts: set[int]) -> list[torch.Tensor | None]:
    """The row orders a conversion may have left: as stored (None), or each head
    count's reverse of llama.cpp's rotary permutation."""
    orders: list[torch.Tensor | None] = [None]
    for num_heads in sorted(head_counts):
        if num_rows % (2 * num_heads) == 0:
            index = torch.arange(num_rows).view(num_heads, num_rows // num_heads // 2, 2)
            orders.append(index.transpose(1, 2).reshape(num_rows))
    return orders
