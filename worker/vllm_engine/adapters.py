"""tokenq's LoRA adapters as vLLM's ``LoRARequest``: numbered once each, loaded into
vLLM the first time a request brings one (so that an adapter vLLM cannot read refuses
that request, rather than failing a step), and the ones vLLM keeps on the device."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from vllm.lora.request import LoRARequest

from shared.refusal import invalid
from worker.engine.request import LoraRef
from worker.vllm_engine.mapping import LoraIds


class Adapters:
    """The adapters of one vLLM engine (``lora_config`` None: it serves none)."""

    def __init__(self, llm: Any, lora_config: Any) -> None:
        self.llm = llm
        self.max_loras: int = lora_config.max_loras if lora_config is not None else 0
        self.max_lora_rank: int = lora_config.max_lora_rank if lora_config is not None else 0
        self._ids = LoraIds()
        self._loaded: set[int] = set()
        self._recent: OrderedDict[str, None] = OrderedDict()

    def request(self, lora: LoraRef | None) -> LoRARequest | None:
        """vLLM's request for ``lora`` (loaded now if it is new); RequestRefused naming
        ``lora`` when vLLM cannot load it."""
        if lora is None:
            return None
        lora_request = LoRARequest(lora.name, self._ids.id_of(lora), lora.path)
        if lora_request.lora_int_id not in self._loaded:
            try:
                self.llm.add_lora(lora_request)
            except Exception as e:  # vLLM's loader: a bad directory, a rank over the limit
                said = " ".join(str(e).split())
                raise invalid("lora", f"lora: vLLM could not load {lora.name!r}: {said}") from e
            self._loaded.add(lora_request.lora_int_id)
        self._recent[lora.name] = None
        self._recent.move_to_end(lora.name)
        while len(self._recent) > self.max_loras:
            self._recent.popitem(last=False)
        return lora_request

    def resident(self) -> list[str]:
        """The adapters used last, up to ``max_loras``: vLLM keeps the ones used last on
        the device (asked here, not of vLLM: its engine core answers only the loop)."""
        return list(reversed(self._recent))
