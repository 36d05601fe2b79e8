import time

import pytest

from shared.models import FinishReason, SamplingParams
from worker.engine.config import EngineConfig
from worker.engine.request import EngineRequest
from worker.flags import Flags
from worker.main import engine_config
from worker.sim import SimConfig, SimEngine, is_sim


def test_parse_settings_and_refuse_unknown_ones() -> None:
    assert SimConfig.parse("sim:") == SimConfig()
    assert SimConfig.parse("sim:step_ms=5,knee=4,max_num_seqs=8") == SimConfig(5.0, 4, 8)
    with pytest.raises(ValueError, match="unknown simulation setting 'speed'"):
        SimConfig.parse("sim:speed=3")
    assert is_sim("sim:") and not is_sim("SmolLM2-135M-Instruct")


def test_the_worker_s_lora_options_say_which_adapter_requests_it_claims() -> None:
    def limit(max_loras: int = 4, max_lora_rank: int = 16) -> int:
        flags = Flags.defaults(EngineConfig, max_loras=max_loras, max_lora_rank=max_lora_rank)
        config = engine_config("sim:knee=4", flags)
        assert isinstance(config, SimConfig)
        return SimEngine(config).lora_rank_limit()

    assert (limit(), limit(max_lora_rank=64), limit(max_loras=0)) == (16, 64, 0)
    with pytest.raises(ValueError, match="--max-lora-rank at least 1"):
        limit(max_lora_rank=0)
    with pytest.raises(ValueError, match="unknown simulation setting 'max_loras'"):
        SimConfig.parse("sim:max_loras=0")  # the worker's --max-loras says it


def test_step_time_is_flat_until_the_knee_then_linear() -> None:
    sim = SimConfig(step_ms=10, knee=4)
    assert sim.step_s(1) == sim.step_s(4) == 0.01
    assert sim.step_s(8) == pytest.approx(0.02)


def test_runs_requests_to_length_and_honours_abort_and_deadline() -> None:
    engine = SimEngine(SimConfig(step_ms=0.1, knee=8))
    engine.add_request(EngineRequest("a", [1, 2], SamplingParams(max_tokens=3)))
    engine.add_request(EngineRequest("b", [1], SamplingParams(max_tokens=50)))
    engine.add_request(
        EngineRequest("c", [1], SamplingParams(max_tokens=50), deadline_unix_s=time.time() - 1)
    )
    outputs: dict[str, list[object]] = {}
    engine.abort_request("b")
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert [o.text for o in outputs["a"]] == ["sim0 ", "sim1 ", "sim2 "]  # type: ignore[attr-defined]
    assert outputs["a"][-1].finish_reason is FinishReason.LENGTH  # type: ignore[attr-defined]
    assert outputs["b"][-1].finish_reason is FinishReason.CANCELLED  # type: ignore[attr-defined]
    assert outputs["c"][-1].finish_reason is FinishReason.TIMEOUT  # type: ignore[attr-defined]
