from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from producer import bounded_server
from producer.dashboard import cli


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `tokenq dashboard` would hand to the server, without serving."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr(
        bounded_server, "serve_bounded", lambda app, **kw: seen.update(app=app, **kw)
    )
    monkeypatch.delenv("TOKENQ_ADMIN_TOKEN", raising=False)
    return seen


def _run(*args: str) -> str:
    app = typer.Typer()
    app.command()(cli.dashboard)
    result = CliRunner().invoke(app, ["--redis", "redis://127.0.0.1:1/0", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_without_a_token_it_makes_a_one_off_and_prints_the_link(served: dict[str, Any]) -> None:
    output = _run("--port", "8123")
    assert "made a one-off admin token" in output
    assert "http://127.0.0.1:8123/admin/#token=" in output
    assert served["port"] == 8123
    assert served["graceful_s"] == cli.GRACEFUL_SHUTDOWN_S


def test_with_a_token_the_link_carries_none(
    served: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENQ_ADMIN_TOKEN", "tok")
    output = _run("--read-only-view")
    assert "#token=" not in output
    assert output.strip().endswith("http://127.0.0.1:8001/admin/")


def test_loading_the_command_loads_no_web_stack() -> None:
    code = "import sys, producer.dashboard.cli; print('fastapi' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
