"""An ASGI middleware that guards request bodies: who may send one, and how big.

FastAPI reads and parses a route's body before it runs the route's dependencies, so
an API key checked as a dependency is checked only after the whole body is in
memory. This middleware asks ``gate`` first, from the headers alone, and answers its
refusal without reading a byte of the body; an accepted body is passed on as it
arrives, and refused with 413 as soon as it is past ``max_body_bytes`` (at once when
Content-Length says so), so no more than the limit is ever held.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The refusal for a request that carries a body, or None to let it in.
Gate = Callable[[Request], Response | None]


@dataclass(frozen=True)
class PathLimit:
    """Another limit for one path (an upload's): bodies up to ``max_bytes``, and the
    413's ``message`` (which names the limit its users know)."""

    max_bytes: int
    message: str


class BodyTooLarge(HTTPException):
    """Raised to the app reading a body past the limit (the 413 is already sent)."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


def too_large_message(max_body_bytes: int) -> str:
    return (
        f"request body too large: the limit is {max_body_bytes} bytes "
        "(TOKENQ_GATEWAY_MAX_BODY_BYTES); send a smaller body"
    )


def too_large(message: str) -> Response:
    error = {
        "message": message,
        "type": "invalid_request_error",
        "param": None,
        "code": "body_too_large",
    }
    return JSONResponse({"error": error}, status_code=413, headers={"Connection": "close"})


class BodyGuard:
    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        gate: Gate,
        path_limits: Mapping[str, PathLimit] | None = None,
    ) -> None:
        self.app = app
        self.default = PathLimit(max_body_bytes, too_large_message(max_body_bytes))
        self.gate = gate
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        refusal = self.gate(Request(scope))
        length = _content_length(scope)
        limit = self.path_limits.get(scope["path"], self.default)
        if refusal is None and length is not None and length > limit.max_bytes:
            refusal = too_large(limit.message)
        if refusal is not None:
            refusal.headers["Connection"] = "close"  # the unread body ends the connection
            await refusal(scope, receive, send)
            return
        await _Limited(self.app, limit, receive, send).run(scope)


class _Limited:
    """One request whose body is counted as the app reads it."""

    def __init__(self, app: ASGIApp, limit: PathLimit, receive: Receive, send: Send) -> None:
        self.app, self.limit = app, limit
        self.receive_next, self.send_next = receive, send
        self.num_bytes = 0
        self.started = False
        self.refused = False
        self.scope: Scope = {}

    async def run(self, scope: Scope) -> None:
        self.scope = scope
        await self.app(scope, self.receive, self.send)

    async def receive(self) -> Message:
        message = await self.receive_next()
        if message["type"] == "http.request":
            self.num_bytes += len(message.get("body", b""))
            if self.num_bytes > self.limit.max_bytes:
                await self._refuse()
        return message

    async def _refuse(self) -> None:
        if not self.started:
            self.refused = True
            await too_large(self.limit.message)(self.scope, self.receive_next, self.send_next)
        raise BodyTooLarge(self.limit.message)

    async def send(self, message: Message) -> None:
        if self.refused:
            return  # the app's own answer to BodyTooLarge: the 413 has gone already
        if message["type"] == "http.response.start":
            self.started = True
        await self.send_next(message)


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
