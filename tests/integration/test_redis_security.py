"""Redis URLs with a password, an ACL user and TLS reach a real redis-server, for the
client and the worker loop alike."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import trustme

from producer.client import Client
from producer.embedded import free_port, wait_for_redis
from shared.connection import connect
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
    service = WorkerService(ScriptedEngine(), connect(url), settings, "m", "w1")
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


def test_a_primary_found_through_sentinel_over_tls(tmp_path: Path) -> None:
    """rediss+sentinel://: TLS to the sentinel and to the primary it names, with a CA the
    URL gives, for the client and the worker loop alike."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(tmp_path / "key.pem")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "cert.pem")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    tls = [f"tls-cert-file {tmp_path / 'cert.pem'}", f"tls-key-file {tmp_path / 'key.pem'}",
           f"tls-ca-cert-file {tmp_path / 'ca.pem'}", "tls-auth-clients no"]  # fmt: skip
    primary, sentinel = free_port(), free_port()
    (tmp_path / "redis.conf").write_text(
        "\n".join(["port 0", f"tls-port {primary}", "bind 127.0.0.1", 'save ""', *tls]) + "\n"
    )
    (tmp_path / "sentinel.conf").write_text(
        "\n".join([
            "port 0", f"tls-port {sentinel}", "bind 127.0.0.1", f"dir {tmp_path}",
            "tls-replication yes", *tls, f"sentinel monitor tokenq 127.0.0.1 {primary} 1",
        ]) + "\n"
    )  # fmt: skip
    procs = [
        subprocess.Popen(["redis-server", str(tmp_path / "redis.conf")], stdout=subprocess.DEVNULL),
        subprocess.Popen(["redis-server", str(tmp_path / "sentinel.conf"), "--sentinel"],
                         stdout=subprocess.DEVNULL),
    ]  # fmt: skip
    try:
        url = f"rediss+sentinel://127.0.0.1:{sentinel}/tokenq?ssl_ca_certs={tmp_path / 'ca.pem'}"
        _wait_for_sentinel(url)
        _round_trip(url)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


def _wait_for_sentinel(url: str) -> None:
    give_up = time.monotonic() + 10
    while True:
        try:
            connect(url).ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.1)
