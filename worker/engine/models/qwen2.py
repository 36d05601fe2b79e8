"""Qwen2 and Qwen2.5: Llama with biases on q/k/v and a window on the layers
``layer_types`` marks sliding (``use_sliding_window``, ``max_window_layers``)."""

from worker.engine.models.family import Family, layer_type_windows

FAMILY = Family("qwen2", ("qwen2",), windows=layer_type_windows)
