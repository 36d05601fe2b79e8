"""The start-up self-check: the engine's forward against transformers' own.

Two probe prompts go through the engine's own runner as serving would run them (one
prefilled whole beside the first half of the other, then the other's second half
beside the first's decode step, then the other's decode step: prefill at a
sequence's start, prefill over cached context, decode, and two sequences in one
step), and each prompt alone, with its decode token, through transformers' forward
in eager attention. The logits must agree within a tolerance for the dtype, relative
to the largest reference logit (:data:`TOLERANCES`).

transformers' attention calls are recorded on the way: each layer's scale, sliding
window, soft-cap and sinks must be the ones the fused forward runs (a probe much
shorter than a window could not show a wrong window in its logits), and an option
the engine does not know is refused.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from shared.models import SamplingParams
from worker.engine.attention import IGNORED_KWARGS, AttentionSpec
from worker.engine.errors import UnsupportedModel
from worker.engine.model_runner import ModelRunner
from worker.engine.models.decoder import DecoderModel
from worker.engine.outputs import ScheduledSeq
from worker.engine.request import EngineRequest, Sequence

log = logging.getLogger(__name__)

# Largest |engine - transformers| logit, as a share of max(1, largest |logit|).
TOLERANCES = {torch.float32: 1e-3, torch.bfloat16: 6e-2, torch.float16: 3e-2}
# With --quantization w8a8 each row's activations enter a projection in 8 bits: 255
# levels over the row's range, coarser than bf16's 8-bit mantissa per value.
W8A8_TOLERANCE = 0.1
PROBES = (
    "The quick brown fox jumps over the lazy dog, and the dog sleeps on.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(10))",
)
REFERENCE_ATTENTION = "tokenq_reference"


def self_check(runner: ModelRunner, name: str) -> float:
    """Raise :class:`UnsupportedModel` unless the engine's logits match transformers';
    returns the relative difference found."""
    prompts = _probe_prompts(runner)
    recorder = _Recorder()
    reference = [_reference(runner.model, prompt, recorder) for prompt in prompts]
    _check_specs(runner, name, recorder)
    try:
        engine = _engine_logits(runner, prompts)
    except ValueError as e:  # an attention option the fallback's attention refuses
        raise UnsupportedModel(f"model {name}: {e}") from e
    expected = torch.cat(reference).float()
    got = engine.float()
    scale = max(1.0, expected.abs().max().item())
    difference = (got - expected.to(got.device)).abs().max().item() / scale
    tolerance = _tolerance(runner)
    if not difference <= tolerance:
        raise UnsupportedModel(
            f"model {name}: self-check failed: its logits differ from transformers' by "
            f"{difference:.3g} of the largest logit, over the {tolerance:g} allowed in "
            f"{str(runner.dtype).removeprefix('torch.')}; not served (see worker.engine.self_check)"
        )
    log.info(
        "self-check passed: logits within %.2g of transformers' (tolerance %g)",
        difference,
        tolerance,
    )
    return difference


def _tolerance(runner: ModelRunner) -> float:
    """The dtype's; with quantized weights, bf16's (the reference runs on the same
    dequantized weights, and the int8 kernel takes its activations in bf16) or
    w8a8's (``worker.engine.quantization``)."""
    if runner.quantization == "w8a8":
        return W8A8_TOLERANCE
    if runner.quantization is not None:
        return TOLERANCES[torch.bfloat16]
    return TOLERANCES.get(runner.dtype, TOLERANCES[torch.float32])


def _probe_prompts(runner: ModelRunner) -> list[list[int]]:
    vocab_size = runner.model.config.get_text_config().vocab_size
    room = (runner.null_slot // runner.block_size // 2) * runner.block_size - 2
    prompts = []
    for text in PROBES:
        ids = [int(t) % vocab_size for t in runner.tokenizer.encode(text)]
        prompts.append(ids[: max(2, room)])
    return prompts


def _engine_logits(runner: ModelRunner, prompts: list[list[int]]) -> torch.Tensor:
    """The logits of each prompt's last token and of its decode token, in that order,
    from three steps (see the module docs)."""
    first, second = (_sequence(prompt, i) for i, prompt in enumerate(prompts))
    size = runner.block_size
    first_blocks = -(-(len(prompts[0]) + 1) // size)
    first.block_table = list(range(first_blocks))
    second.block_table = list(range(first_blocks, first_blocks + -(-(len(prompts[1]) + 1) // size)))
    if runner.state_cache is not None:
        # Slot 1 may be the scratch slot (a budget of one slot): nothing else runs now.
        first.state_slot, second.state_slot = 0, 1
    num_first, num_second = len(prompts[0]), len(prompts[1])
    half = num_second // 2
    step1 = runner.logits(
        [ScheduledSeq(first, 0, num_first, True), ScheduledSeq(second, 0, half, False)]
    )
    first.token_ids.append(prompts[0][0])
    step2 = runner.logits(
        [
            ScheduledSeq(second, half, num_second - half, True),
            ScheduledSeq(first, num_first, 1, True),
        ]
    )
    second.token_ids.append(prompts[1][0])
    step3 = runner.logits([ScheduledSeq(second, num_second, 1, True)])
    return torch.cat([step1, step2[1:], step2[:1], step3])


def _sequence(prompt: list[int], number: int) -> Sequence:
    request = EngineRequest(f"self-check-{number}", list(prompt), SamplingParams(max_tokens=1))
    return Sequence.from_request(request, number)


class _Recorder:
    """An attention function recording what transformers asks of each layer, then
    computing it with the module's own eager attention."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, Any]] = {}

    def __call__(
        self, module: Any, query: Any, key: Any, value: Any, mask: Any, **kwargs: Any
    ) -> Any:
        layer = int(getattr(module, "layer_idx", 0))
        self.calls.setdefault(layer, dict(kwargs))
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is None:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            eager = sdpa_attention_forward
        return eager(module, query, key, value, mask, **kwargs)


def _reference(model: Any, prompt: list[int], recorder: _Recorder) -> torch.Tensor:
    """transformers' logits for the prompt's last token and its decode token."""
    previous = model.config._attn_implementation
    AttentionInterface.register(REFERENCE_ATTENTION, recorder)
    AttentionMaskInterface.register(REFERENCE_ATTENTION, eager_mask)
    model.set_attn_implementation(REFERENCE_ATTENTION)
    ids = torch.tensor([[*prompt, prompt[0]]], device=model.device)
    try:
        with torch.inference_mode():
            logits = model(input_ids=ids, use_cache=False).logits[0, -2:]
    finally:
        model.set_attn_implementation(previous)
    return logits  # type: ignore[no-any-return]


def _check_specs(runner: ModelRunner, name: str, recorder: _Recorder) -> None:
    """The fused forward's attention options are the ones transformers asked for."""
    unknown = {
        option
        for call in recorder.calls.values()
        for option, value in call.items()
        if value is not None and option not in IGNORED_KWARGS | _SPEC_KWARGS
    }
    if unknown:
        raise UnsupportedModel(
            f"model {name}: its attention takes option(s) the engine does not run: "
            f"{', '.join(sorted(unknown))}"
        )
    if not isinstance(runner.forward_fn, DecoderModel):
        return  # transformers' own forward passes its options on as they come
    forward = runner.forward_fn
    for layer, spec in zip(forward.attention_layers, forward.specs, strict=True):
        mismatch = _mismatch(spec, recorder.calls.get(layer, {}))
        if mismatch:
            raise UnsupportedModel(
                f"model {name}: layer {layer}'s attention {mismatch} in transformers, not as "
                "the engine's description of this family has it"
            )


_SPEC_KWARGS = frozenset({"scaling", "sliding_window", "softcap", "s_aux"})


def _mismatch(spec: AttentionSpec, call: dict[str, Any]) -> str | None:
    if call.get("sliding_window") != spec.window:
        return f"has sliding window {call.get('sliding_window')}"
    if call.get("softcap") != spec.softcap:
        return f"has soft-cap {call.get('softcap')}"
    scaling = call.get("scaling")
    if scaling is not None and abs(float(scaling) - spec.scale) > 1e-6 * abs(spec.scale):
        return f"scales by {scaling}"
    sinks = call.get("s_aux")
    if (sinks is None) != (spec.sinks is None):
        return "has sinks" if sinks is not None else "has no sinks"
    if sinks is not None and spec.sinks is not None and not torch.equal(sinks.float(), spec.sinks):
        return "has other sinks"
    return None
