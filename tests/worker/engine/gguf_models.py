"""A transformers model written as a Q8_0 GGUF file, as llama.cpp's converter writes
one (its q and k rows permuted for llama.cpp's rotary), and the model's weights set
to the file's dequantized values, as converting that file back gives them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch


def permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's ``convert_hf_to_gguf`` permutation of a q or k projection's rows."""
    shape = weights.shape
    return (
        weights.reshape(num_heads, 2, shape[0] // num_heads // 2, *shape[1:])
        .swapaxes(1, 2)
        .reshape(shape)
    )


def unpermute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    shape = weights.shape
    return (
        weights.reshape(num_heads, shape[0] // num_heads // 2, 2, *shape[1:])
        .swapaxes(1, 2)
        .reshape(shape)
    )


def write_q8_0_model(model: Any, path: Path) -> int:
    """Write ``model``'s 2-D weights to a Q8_0 GGUF at ``path`` (architecture llama) and
    set them to the file's dequantized values. Returns the number of tensors written."""
    import gguf
    from gguf.quants import dequantize, quantize

    config = model.config
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    writer = gguf.GGUFWriter(str(path), arch="llama")
    num_written = 0
    with torch.no_grad():
        for hf_name, param in model.named_parameters():
            gguf_name = name_map.get_name(hf_name, (".weight",))
            if param.dim() != 2 or gguf_name is None:
                continue
            num_heads = next((n for key, n in heads.items() if f".{key}." in gguf_name), None)
            values = param.detach().float().numpy()
            stored = values if num_heads is None else permute(values, num_heads)
            blocks = quantize(stored, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            widened = dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
            back = widened if num_heads is None else unpermute(widened, num_heads)
            param.copy_(torch.from_numpy(np.ascontiguousarray(back)))
            num_written += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return num_written
