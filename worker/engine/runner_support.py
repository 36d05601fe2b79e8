"""The model runner's small helpers: device and dtype choice, EOS ids, host memory,
the KV and state layers a forward has, and whether it can be captured as CUDA graphs."""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from worker.engine.models.decoder import DecoderModel
from worker.engine.models.moe import SparseMoe
from worker.engine.models.shared_expert import SharedExpertMoe
from worker.engine.models.state import StateShapes

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# CPU flags (``/proc/cpuinfo``) of an instruction set that computes in bf16 itself.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """The weights' dtype: ``auto`` is bf16 on CUDA and fp32 on the CPU (bf16 there is
    one flag away, and refused on a CPU that would only emulate it)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use one of auto, {', '.join(DTYPES)}")
    dtype = DTYPES[name]
    if dtype is torch.bfloat16 and device.type == "cpu" and not native_bf16():
        raise ValueError(
            f"--dtype {name}: this CPU has no native bf16 (AVX512-BF16 or AMX), so bf16 "
            "weights would be emulated and slower than fp32; serve fp32 (--dtype auto)"
        )
    return dtype


@cache
def cpu_flags() -> frozenset[str]:
    """This CPU's instruction-set flags, from the kernel's ``/proc/cpuinfo`` (torch's
    ``get_cpu_capability`` names AVX512 alone); none where there is no such file."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16() -> bool:
    """Whether this CPU computes in bf16 itself (AVX512-BF16 or AMX-BF16)."""
    return not NATIVE_BF16_FLAGS.isdisjoint(cpu_flags())


def eos_token_ids(model: Any, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def available_host_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def graphs_supported(model: DecoderModel, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a CUDA graph can capture the forward: a MoE layer's grouped matmul runs
    without a host sync only in bf16 on Hopper or Blackwell (elsewhere torch's
    fallback reads the experts' offsets on the host)."""
    if not any(isinstance(layer.mlp, SparseMoe | SharedExpertMoe) for layer in model.layers):
        return True
    major, _ = torch.cuda.get_device_capability(device)
    if dtype == torch.bfloat16 and major in (9, 10):
        return True
    log.info("MoE layers in %s on compute capability %d.x: steps run eagerly", dtype, major)
    return False


def num_kv_layers(forward: Any, num_layers: int) -> int:
    """The layers that hold a KV pool: the fused forward's attention layers (a hybrid's
    others keep a state instead), every layer of transformers' own."""
    return len(forward.attention_layers) if isinstance(forward, DecoderModel) else num_layers


def state_shapes(forward: Any, dtype: torch.dtype) -> list[StateShapes]:
    """Each state layer's tensors per slot (none but in a hybrid model)."""
    if not isinstance(forward, DecoderModel):
        return []
    return [mixer.state_shapes(dtype) for mixer in forward.state_mixers]


# What a CUDA error says when the device (or its context) is unusable from then on.
_DEVICE_ERROR_MARKS = ("CUDA error", "device-side assert", "cuDNN error", "CUBLAS_STATUS")


def device_broken(error: BaseException) -> bool:
    """Whether ``error`` leaves the device unusable (the worker must end), rather
    than being about the requests of the step that raised it."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _DEVICE_ERROR_MARKS)
