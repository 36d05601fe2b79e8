"""The gateway guards itself against bodies: a key (or the admin token) is checked
from the headers before a byte of the body is read, and a body past the limit is
refused with 413 as it arrives. A real gateway process, spoken to over a raw socket
so the test decides how much of a body is ever sent."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from producer.embedded import EmbeddedRedis
from tests.producer.gateway.process import started_gateway

pytestmark = pytest.mark.integration

LIMIT_BYTES = 1024 * 1024
HUGE_BYTES = 100 * 1024 * 1024
CHUNK = b"x" * (1024 * 1024)
RSS_GROWTH_BYTES = 8 * 1024 * 1024  # a few MB of allocator noise, far below the body
KEY = {"Authorization": "Bearer sk-a"}
JSON_KEY = {**KEY, "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def gateway(redis_server: EmbeddedRedis) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    env = {"TOKENQ_GATEWAY_MAX_BODY_BYTES": str(LIMIT_BYTES), "TOKENQ_ADMIN_TOKEN": "admin-t"}
    with started_gateway(redis_server.url, "sk-a=acme", **env) as running:
        yield running


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gateway", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_reply(sock: socket.socket) -> tuple[int, dict[str, object]]:
    data = b""
    while b"\r\n\r\n" not in data or not _complete(data):
        piece = sock.recv(65536)
        if not piece:
            break
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body)


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def _send_body(sock: socket.socket, num_bytes: int, chunked: bool) -> int:
    """Sends up to ``num_bytes`` of body until the gateway stops taking it; returns how
    many bytes went."""
    sent = 0
    try:
        while sent < num_bytes:
            frame = b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK) if chunked else CHUNK
            sock.sendall(frame)
            sent += len(CHUNK)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the gateway answered and closed: the rest of the body is never read
    return sent


def _connect(url: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", _port(url)), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 * 1024)
    return sock


def _huge(url: str, pid: int, path: str, headers: dict[str, str], chunked: bool) -> int:
    """Streams a 100 MB body; returns the status answered and checks the gateway's RSS."""
    framing = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(HUGE_BYTES)}
    before = _rss_bytes(pid)
    with _connect(url) as sock:
        sock.sendall(_head(path, {**headers, **framing}))
        _send_body(sock, HUGE_BYTES, chunked)
        status, _ = _read_reply(sock)
    assert _rss_bytes(pid) - before < RSS_GROWTH_BYTES
    return status


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/requests", "/v1/batches"])
def test_no_key_is_refused_401_before_a_byte_of_the_body_is_read(
    gateway: tuple[str, subprocess.Popen[bytes]], path: str
) -> None:
    url, _ = gateway
    with _connect(url) as sock:
        sock.sendall(_head(path, {"Content-Length": str(HUGE_BYTES)}))
        status, body = _read_reply(sock)  # no body sent at all: the answer comes anyway
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key"  # type: ignore[index]


def test_an_unknown_key_is_refused_401_before_the_body(
    gateway: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, _ = gateway
    with _connect(url) as sock:
        headers = {"Content-Length": str(HUGE_BYTES), "Authorization": "Bearer sk-wrong"}
        sock.sendall(_head("/v1/completions", headers))
        status, body = _read_reply(sock)
    assert status == 401
    assert "unknown API key" in body["error"]["message"]  # type: ignore[index]


def test_the_dashboards_actions_check_the_admin_token_before_the_body(
    gateway: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, _ = gateway
    with _connect(url) as sock:
        sock.sendall(_head("/admin/api/loras", {"Content-Length": str(HUGE_BYTES)}))
        status, body = _read_reply(sock)
    assert status == 401
    assert body["error"]["code"] == "admin_token_required"  # type: ignore[index]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_unauthenticated_100mb_body_does_not_grow_the_gateway(
    gateway: tuple[str, subprocess.Popen[bytes]], chunked: bool
) -> None:
    url, proc = gateway
    assert _huge(url, proc.pid, "/v1/chat/completions", {}, chunked) == 401


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_authenticated_body_past_the_limit_is_refused_413(
    gateway: tuple[str, subprocess.Popen[bytes]], chunked: bool
) -> None:
    url, proc = gateway
    assert _huge(url, proc.pid, "/v1/chat/completions", KEY, chunked) == 413


def test_the_413_says_what_the_limit_is(gateway: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, _ = gateway
    body = b'{"model": "m", "prompt": "' + b"y" * LIMIT_BYTES + b'"}'
    reply = httpx.post(f"{url}/v1/completions", content=body, headers=KEY, timeout=30)
    assert reply.status_code == 413
    error = reply.json()["error"]
    assert error["code"] == "body_too_large"
    assert f"limit is {LIMIT_BYTES} bytes" in error["message"]


def test_a_body_within_the_limit_is_served(gateway: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, _ = gateway
    body = {"model": "m", "prompt": "y" * 150_000, "sampling": {"max_tokens": 1}}
    with httpx.Client(base_url=url, timeout=30) as http:
        reply = http.post("/v1/requests", json=body, headers=KEY)
        streamed = http.post("/v1/requests", content=_chunks(orjson.dumps(body)), headers=JSON_KEY)
    # Past the guard, the route answers as always (here: no worker ever served "m").
    assert reply.status_code == 404, reply.text
    assert reply.json()["error"]["code"] == "model_not_found"
    assert streamed.status_code == 404, streamed.text


def _chunks(data: bytes) -> Iterator[bytes]:
    for start in range(0, len(data), 4096):
        yield data[start : start + 4096]
