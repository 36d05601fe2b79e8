"""A loopback HTTP server that records webhook calls and answers from a script."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Call:
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int


@dataclass
class Receiver:
    url: str
    answers: list[int] = field(default_factory=list)  # popped per call; then 200
    calls: list[Call] = field(default_factory=list)
    got_call: threading.Condition = field(default_factory=threading.Condition)

    def next_answer(self) -> int:
        return self.answers.pop(0) if self.answers else 200

    def record(self, call: Call) -> None:
        with self.got_call:
            self.calls.append(call)
            self.got_call.notify_all()

    def wait_for_calls(self, num_calls: int, timeout_s: float) -> list[Call]:
        with self.got_call:
            if not self.got_call.wait_for(lambda: len(self.calls) >= num_calls, timeout_s):
                raise AssertionError(f"got {len(self.calls)} webhook call(s), not {num_calls}")
            return list(self.calls)

    def accepted(self) -> list[Call]:
        return [c for c in self.calls if 200 <= c.answered < 300]


@contextmanager
def receiver(answers: list[int] | None = None) -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 (a free port) for the length of the block."""
    state = Receiver(url="", answers=list(answers or []))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status = state.next_answer()
            state.record(Call(self.path, dict(self.headers.items()), body, status))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
