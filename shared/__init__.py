"""tokenq's wire protocol: models, key names, Lua scripts, settings and errors."""

from shared.errors import (
    InvalidRequest,
    NotFound,
    QueueFull,
    RateLimited,
    TokenqError,
)
from shared.models import (
    ChatMessage,
    FinalEvent,
    FinishReason,
    GenerationRequest,
    RequestState,
    Result,
    SamplingParams,
    StreamEvent,
    Timings,
    TokenEvent,
    Usage,
)
from shared.priority import Priority, parse_priority

__all__ = [
    "ChatMessage",
    "FinalEvent",
    "FinishReason",
    "GenerationRequest",
    "InvalidRequest",
    "NotFound",
    "Priority",
    "QueueFull",
    "RateLimited",
    "RequestState",
    "Result",
    "SamplingParams",
    "StreamEvent",
    "Timings",
    "TokenEvent",
    "TokenqError",
    "Usage",
    "parse_priority",
]
