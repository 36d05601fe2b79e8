"""Mistral: Llama with a sliding window on every layer (where ``sliding_window`` is set)."""

from worker.engine.models.family import Family, every_layer_window

FAMILY = Family("mistral", ("mistral",), windows=every_layer_window)
