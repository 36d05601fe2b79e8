"""Typed errors shared by every part. Messages say what was wrong and what to do."""


class TokenqError(Exception):
    """Base of every error tokenq raises on purpose."""


class InvalidRequest(TokenqError, ValueError):
    """A request or a stored payload failed validation."""


class QueueFull(TokenqError):
    """The model's queue is at its bound; retry later."""

    def __init__(self, model: str, max_queued: int, retry_after_s: float = 1.0) -> None:
        super().__init__(
            f"queue for model {model!r} is full ({max_queued} requests waiting); "
            f"retry in {retry_after_s:g}s or raise TOKENQ_MAX_QUEUED"
        )
        self.model = model
        self.max_queued = max_queued
        self.retry_after_s = retry_after_s


class RateLimited(TokenqError):
    """An API key is over one of its rate limits (``shared.ratelimit``): retry after
    ``retry_after_s`` (None: this request can never fit; make it smaller)."""

    def __init__(self, message: str, retry_after_s: float | None, headers: dict[str, str]) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.headers = headers


class UnknownModel(InvalidRequest):
    """No worker has served this model recently."""

    def __init__(self, model: str) -> None:
        super().__init__(
            f"model {model!r} is not served by any worker: start one with "
            f"`tokenq worker --model {model}` (or set TOKENQ_REQUIRE_KNOWN_MODEL=false "
            f"to queue requests for it anyway)"
        )
        self.model = model


class ModelUnavailable(UnknownModel):
    """No worker serves this model, and the last one to try could not load it."""

    def __init__(self, model: str, reason: str) -> None:
        InvalidRequest.__init__(
            self,
            f"model {model!r} is not served: the last worker started for it could not load "
            f"it ({reason}); fix that and start a worker again",
        )
        self.model = model
        self.reason = reason


class UnknownAdapter(InvalidRequest):
    """The request names a LoRA adapter that is not registered for its model."""

    def __init__(self, model: str, name: str) -> None:
        super().__init__(
            f"LoRA adapter {name!r} is not registered for model {model!r}: register it with "
            f"`tokenq lora add {model} {name} PATH` (GET /v1/models lists the adapters)"
        )
        self.model = model
        self.name = name


class MissingCapability(InvalidRequest):
    """No live worker of the model can serve what the request asks for."""

    def __init__(self, model: str, capability: str) -> None:
        super().__init__(
            f"no live worker of model {model!r} serves {capability}: its workers lack the "
            "grammar backend (xgrammar); ask without guided_json / guided_regex / "
            "response_format, or start a worker that has it"
        )
        self.model = model
        self.capability = capability


class IdempotencyKeyReused(InvalidRequest):
    """An idempotency key sent again with another body than the request it names."""

    def __init__(self, key: str, request_id: str) -> None:
        super().__init__(
            f"idempotency_key {key!r} was already used for request {request_id} with a "
            "different body: send that same body again to get that request, or use a new "
            "key for a new request"
        )
        self.key = key
        self.request_id = request_id


class NotFound(TokenqError, KeyError):
    """No such request (never existed, or expired)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not found"


class RequestTimeout(TokenqError, TimeoutError):
    """Waiting for a result took longer than the caller allowed."""


class RequestFailed(TokenqError):
    """A request ended without the answer asked for (failed, cancelled or expired)."""


class ReplicationTimeout(TokenqError):
    """Redis took a write that decides a request's fate, but fewer replicas than
    TOKENQ_REDIS_MIN_REPLICAS confirmed it in time: a failover now could lose it."""

    def __init__(self, what: str, acked: int, wanted: int, timeout_ms: int) -> None:
        super().__init__(
            f"{what}: only {acked} of the {wanted} Redis replica(s) TOKENQ_REDIS_MIN_REPLICAS "
            f"asks for confirmed it within {timeout_ms} ms (TOKENQ_REDIS_REPLICA_TIMEOUT_MS); "
            "check the replicas (INFO replication on the primary) and retry, or lower "
            "TOKENQ_REDIS_MIN_REPLICAS"
        )
        self.acked = acked
        self.wanted = wanted


class InvalidParam(InvalidRequest):
    """InvalidRequest about one named parameter (the gateway's 400 names it)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
