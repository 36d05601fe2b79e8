"""The dashboard in a real headless Chromium (Debian's package, driven by Playwright):
a live worker on the simulated backend, a running request whose tokens appear on the
page as it generates, the cancel button ending its stream 'cancelled', and a wrong
admin token refused. Saves a screenshot."""

from __future__ import annotations

import os
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from producer.client import Client, Handle
from producer.embedded import EmbeddedRedis, free_port
from shared.keys import Keys
from shared.models import FinishReason, RequestState
from shared.settings import Settings
from tests.conftest import serve
from tests.integration.faults import wait_until
from tests.integration.processes import started

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SIM = "sim:step_ms=200,knee=8,max_num_seqs=8"
TOKEN = "browser-test-token"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOT_COPY = Path("/tmp/tokenq-dashboard.png")


def _status(url: str, token: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


@pytest.fixture
def processes(redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[str]:
    """A sim worker and `python -m producer.dashboard`; yields the dashboard's URL."""
    port = free_port()
    env = {**os.environ, "TOKENQ_ADMIN_TOKEN": TOKEN}
    python = [sys.executable, "-m"]
    commands = {
        "worker": [*python, "producer.cli", "worker", "--redis", redis_server.url, "--model", SIM],
        "dashboard": [
            *python,
            "producer.dashboard",
            "--redis",
            redis_server.url,
            "--port",
            str(port),
            "--sample-interval-s",
            "1",
            "--read-only-view",
        ],
    }
    url = f"http://127.0.0.1:{port}/admin/"
    with started(commands, env, tmp_path):
        wait_until(lambda: _status(url + "api/access", TOKEN) == 200, 60, "the dashboard")
        yield url


def _running_request(connection: redis.Redis) -> Handle:
    """The request the test watches, among others (some queued) so the charts have data."""
    keys = Keys()
    wait_until(lambda: bool(connection.zcard(keys.workers())), 60, "the worker to register")
    client = Client(connection=connection, settings=Settings())
    for _ in range(3):
        client.submit("short", model=SIM, priority="high", max_tokens=5)
    handle = client.submit("watch me generate", model=SIM, max_tokens=200)
    for _ in range(9):
        client.submit("background", model=SIM, priority="low", max_tokens=40)
    wait_until(lambda: handle.status().num_generated > 0, 60, "the request's first tokens")
    return handle


def _launch(playwright: object) -> object:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    chromium = playwright.chromium  # type: ignore[attr-defined]
    return chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def test_dashboard_in_chromium(real_redis: redis.Redis, processes: str, tmp_path: Path) -> None:
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError as e:
        pytest.fail(
            f"{e}: pip install playwright (no `playwright install`: Debian's chromium is used)"
        )
    serve(real_redis, SIM)
    handle = _running_request(real_redis)
    with sync_playwright() as playwright:
        browser = _launch(playwright)
        page = browser.new_page(viewport={"width": 1400, "height": 1500})  # type: ignore[attr-defined]
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            _read_only_then_wrong_token(page, processes, expect)
            _signs_in_and_sees_the_fleet(page, handle, expect)
            _tokens_stream_then_cancel(page, handle, tmp_path, expect)
        finally:
            browser.close()  # type: ignore[attr-defined]
    assert errors == [], f"the page raised: {errors}"
    assert handle.result(timeout=30).finish_reason is FinishReason.CANCELLED
    assert handle.status().state is RequestState.CANCELLED


def _read_only_then_wrong_token(page: object, url: str, expect: object) -> None:
    p: object = page
    p.goto(url)  # type: ignore[attr-defined]
    expect(p.locator("#access")).to_have_text("read-only")  # type: ignore[attr-defined, operator]
    banner = p.locator("#banner")  # type: ignore[attr-defined]
    expect(banner).to_contain_text("Read-only view")  # type: ignore[operator]
    expect(p.locator("#workers tbody")).to_contain_text(SIM)  # type: ignore[attr-defined, operator]
    expect(p.locator("#queues button.act").first).to_be_disabled()  # type: ignore[attr-defined, operator]
    assert _status(url + "api/overview", "not-the-token") == 403
    p.fill("#token", "not-the-token")  # type: ignore[attr-defined]
    p.click("#sign-in")  # type: ignore[attr-defined]
    expect(banner).to_contain_text("wrong admin token")  # type: ignore[operator]
    expect(p.locator("#dashboard")).to_be_hidden()  # type: ignore[attr-defined, operator]


def _signs_in_and_sees_the_fleet(page: object, handle: Handle, expect: object) -> None:
    p: object = page
    p.fill("#token", TOKEN)  # type: ignore[attr-defined]
    p.click("#sign-in")  # type: ignore[attr-defined]
    expect(p.locator("#access")).to_have_text("operator")  # type: ignore[attr-defined, operator]
    workers = p.locator("#workers tbody")  # type: ignore[attr-defined]
    expect(workers).to_contain_text(SIM)  # type: ignore[operator]
    expect(workers).to_contain_text("serving")  # type: ignore[operator]
    expect(p.locator("#queues tbody")).to_contain_text(SIM)  # type: ignore[attr-defined, operator]
    row = p.locator(f'#requests tr[data-id="{handle.id}"]')  # type: ignore[attr-defined]
    expect(row).to_contain_text("running")  # type: ignore[operator]
    row.click()


def _tokens_stream_then_cancel(
    page: object, handle: Handle, tmp_path: Path, expect: object
) -> None:
    p: object = page
    tokens = p.locator("#detail-tokens")  # type: ignore[attr-defined]
    expect(tokens).to_contain_text("sim")  # type: ignore[operator]
    before = len(tokens.inner_text())
    wait_until(lambda: len(tokens.inner_text()) > before, 30, "more tokens on the page")
    expect(p.locator("#chart-depth canvas")).to_have_count(1)  # type: ignore[attr-defined, operator]
    shot = tmp_path / "dashboard.png"
    p.screenshot(path=str(shot), full_page=True)  # type: ignore[attr-defined]
    shutil.copy(shot, SHOT_COPY)
    p.click("#cancel")  # type: ignore[attr-defined]
    final = p.locator("#detail-final")  # type: ignore[attr-defined]
    expect(final).to_contain_text("stream ended: cancelled", timeout=15_000)  # type: ignore[operator]
    expect(p.locator("#detail-state")).to_have_text("cancelled")  # type: ignore[attr-defined, operator]
    p.screenshot(path=str(tmp_path / "dashboard-cancelled.png"), full_page=True)  # type: ignore[attr-defined]
