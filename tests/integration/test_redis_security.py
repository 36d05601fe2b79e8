"""Redis URLs with a password, an ACL user and TLS reach a real redis-server, for the
client and the worker loop alike."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import trustme

from producer.client import Client
from producer.embedded import free_port, wait_for_redis
from shared.models import FinishReason
from shared.settings import Settings
from tests.conftest import serve
from tests.worker.fakes import ScriptedEngine
from worker.service import WorkerService

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-default"
ACL_USER, ACL_PASSWORD = "tokenq", "s3cret-tokenq"


@pytest.fixture
def secured_redis(tmp_path: Path) -> Iterator[tuple[int, int, Path]]:
    """A redis-server with a password, an ACL user, and plain and TLS ports."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(tmp_path / "key.pem")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "cert.pem")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    port, tls_port = free_port(), free_port()
    args = [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--dir",
        str(tmp_path),
        "--requirepass",
        PASSWORD,
        "--user",
        f"{ACL_USER}",
        "on",
        f">{ACL_PASSWORD}",
        "~*",
        "&*",
        "+@all",
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        str(tmp_path / "cert.pem"),
        "--tls-key-file",
        str(tmp_path / "key.pem"),
        "--tls-ca-cert-file",
        str(tmp_path / "ca.pem"),
        "--tls-auth-clients",
        "no",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    wait_for_redis(f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    yield port, tls_port, tmp_path / "ca.pem"
    proc.terminate()
    proc.wait(timeout=10)


def _round_trip(url: str) -> None:
    settings = Settings(redis_url=url)
    client = Client(settings=settings)
    serve(client.redis, "m")
    handle = client.submit("hello there", model="m", max_tokens=3)
    service = WorkerService(ScriptedEngine(), redis.Redis.from_url(url), settings, "m", "w1")
    service.run(burst=True)
    result = handle.result(timeout=5)
    assert (result.text, result.finish_reason) == ("t0t1t2", FinishReason.LENGTH)
    client.close()


def test_password_acl_user_and_tls_urls(secured_redis: tuple[int, int, Path]) -> None:
    port, tls_port, ca = secured_redis
    _round_trip(f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    _round_trip(f"redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{port}/0")
    _round_trip(f"rediss://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{tls_port}/0?ssl_ca_certs={ca}")


def test_a_wrong_password_is_refused_clearly(secured_redis: tuple[int, int, Path]) -> None:
    port, _, _ = secured_redis
    client = Client(settings=Settings(redis_url=f"redis://{ACL_USER}:wrong@127.0.0.1:{port}/0"))
    with pytest.raises(redis.AuthenticationError):
        client.submit("hi", model="m")
    client.close()
