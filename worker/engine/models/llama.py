"""Llama: the base every other description departs from (any rope type, optional
attention and MLP biases)."""

from worker.engine.models.family import Family

FAMILY = Family("llama", ("llama",))
