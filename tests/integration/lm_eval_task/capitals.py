"""The documents of capitals.yaml, read from the JSONL file beside it (lm-eval calls
``load`` with the task's metadata as keyword arguments)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("capitals.jsonl")


def load(**_: Any) -> Any:
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_json(str(DATA))})
