"""Why a worker cannot serve its model.

The engine raises :class:`ModelLoadError` (or :class:`UnsupportedModel`) before the
worker announces itself; its message is one line naming the model and what is wrong
(no such path, not reachable without a hub, an architecture or option the engine
cannot run exactly, a failed self-check), fit to print as it is and to show a client
whose request for that model is refused.
"""

from __future__ import annotations


class ModelLoadError(Exception):
    """The model cannot be loaded or served here; ``str(error)`` is one line."""


class UnsupportedModel(ModelLoadError):
    """The model loads, but the engine cannot run it exactly (refused, never served)."""
