"""What a model's chat template does with tools and reasoning.

The tokenizer (and so the template) is the worker's; the producer side has none. Each
worker detects its template's features when it loads and registers them with its
registry entry (field ``chat``), and the gateway and batches read them: whether tools
go through the template and in which format the model calls them, and the tags around
its reasoning.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
import redis
from pydantic import BaseModel, ConfigDict, ValidationError

from shared.keys import Keys
from shared.replies import text

# How a model writes its tool calls (the names are vLLM's tool parsers'):
#   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>  (Qwen2.5, Qwen3, Hermes)
#   llama3_json  {"name": ..., "parameters": {...}}                         (Llama 3.1 / 3.2 / 3.3)
#   mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]       (Mistral v0.3 on)
ToolFormat = Literal["hermes", "llama3_json", "mistral"]
REGISTRY_FIELD = "chat"
MAX_WORKERS_READ = 10_000


class ChatFeatures(BaseModel):
    """A chat template's features; the defaults are a plain template (no tools, no
    reasoning), which takes tools through tokenq's fallback prompt."""

    # Unknown fields from newer workers are ignored; an unknown format reads as none.
    model_config = ConfigDict(frozen=True, extra="ignore")

    tool_format: ToolFormat | None = None
    think: tuple[str, str] | None = None  # the tags around reasoning, e.g. <think> </think>
    think_open: bool = False  # the generation prompt opens a think block itself

    def to_field(self) -> str:
        return orjson.dumps(self.model_dump(mode="json")).decode()

    @classmethod
    def from_field(cls, raw: Any) -> ChatFeatures | None:
        """The features a registry entry holds; None when absent or unreadable."""
        if not raw:
            return None
        try:
            return cls.model_validate_json(raw)
        except ValidationError:
            return None


def read_chat_features(connection: redis.Redis, keys: Keys, model: str) -> ChatFeatures | None:
    """The chat features a live worker of ``model`` registered (None when none has): the
    synchronous read, for batches; the gateway reads them with its model registry."""
    ids: Any = connection.zrange(keys.workers(), 0, MAX_WORKERS_READ - 1)
    if not ids:
        return None
    pipe = connection.pipeline(transaction=False)
    for worker_id in ids:
        pipe.hmget(keys.worker(text(worker_id)), ["model", REGISTRY_FIELD])
    for name, raw in pipe.execute():
        if name is not None and text(name) == model:
            features = ChatFeatures.from_field(raw)
            if features is not None:
                return features
    return None
