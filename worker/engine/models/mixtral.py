"""Mixtral: Mistral's attention with a sparse MLP (softmax router, top-k renormalised)."""

from worker.engine.models.family import Family, Moe, every_layer_window

FAMILY = Family("mixtral", ("mixtral",), windows=every_layer_window, moe=Moe())
