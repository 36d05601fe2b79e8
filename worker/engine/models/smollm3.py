"""SmolLM3: Llama with no rotary on the layers ``no_rope_layers`` marks 0, and a window
on the layers ``layer_types`` marks sliding (what its attention mask applies)."""

from typing import Any

from worker.engine.models.family import Family, layer_type_windows


def _rope_sets(config: Any) -> list[str | None]:
    return ["" if uses_rope else None for uses_rope in config.no_rope_layers]


FAMILY = Family("smollm3", ("smollm3",), windows=layer_type_windows, rope_sets=_rope_sets)
