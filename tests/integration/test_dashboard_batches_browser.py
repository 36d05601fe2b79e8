"""Batches and usage on the dashboard in a real headless Chromium: a running batch's
progress moves on the page, its Cancel button stops it, and the usage view and the
requests' tenant column show who ran what."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from producer.batch.models import BatchState
from producer.batch.ops import Batches
from producer.client import Client
from producer.embedded import EmbeddedRedis, free_port
from shared.keys import Keys
from shared.settings import Settings
from tests.conftest import as_tenant, serve
from tests.integration.faults import wait_until
from tests.integration.processes import started
from tests.integration.test_dashboard_browser import TOKEN, _launch, _status
from tests.producer.batch.procs import RQ_ENV, rq_batch_settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SIM = "sim:step_ms=100,knee=4,max_num_seqs=4"
NUM_LINES = 400
URL = "/v1/chat/completions"


def _jsonl(num_lines: int) -> str:

    lines = []
    for i in range(num_lines):
        body = {"model": SIM, "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 3}
        lines.append(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": body,
            }
        )
    return "\n".join(orjson.dumps(x).decode() for x in lines) + "\n"


@pytest.fixture
def processes(redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[str]:
    """A sim worker, an RQ batch worker and the dashboard; yields the dashboard's URL."""
    port = free_port()
    env = {**os.environ, **RQ_ENV, "TOKENQ_ADMIN_TOKEN": TOKEN}
    python, url = [sys.executable, "-m"], redis_server.url
    commands = {
        "worker": [*python, "producer.cli", "worker", "--redis", url, "--model", SIM],
        "rq": [*python, "producer.batch.cli", "worker", "--redis", url, "--no-scheduler"],
        "dashboard": [*python, "producer.dashboard", "--redis", url, "--port", str(port)],
    }
    page_url = f"http://127.0.0.1:{port}/admin/"
    with started(commands, env, tmp_path):
        wait_until(lambda: _status(page_url + "api/access", TOKEN) == 200, 60, "the dashboard")
        yield page_url


def test_a_running_batch_moves_on_the_page_and_its_cancel_stops_it(
    real_redis: redis.Redis, redis_server: EmbeddedRedis, processes: str
) -> None:
    from playwright.sync_api import expect, sync_playwright

    serve(real_redis, SIM)
    wait_until(lambda: bool(real_redis.zcard(Keys().workers())), 60, "the worker to register")
    client = Client(connection=real_redis, settings=Settings(redis_url=redis_server.url))
    as_tenant(client, "acme").submit("one for acme", model=SIM, max_tokens=2).result(60)
    batches = Batches(client, rq_batch_settings())
    batch_id = batches.submit(_jsonl(NUM_LINES), tenant="acme")
    with sync_playwright() as playwright:
        browser = _launch(playwright)
        page = browser.new_page(viewport={"width": 1400, "height": 1800})  # type: ignore[attr-defined]
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(processes)
            page.fill("#token", TOKEN)
            page.click("#sign-in")
            row = page.locator(f'#batches tr[data-batch="{batch_id}"]')
            expect(row).to_contain_text("in_progress", timeout=30_000)
            expect(row).to_contain_text("acme")
            progress = row.locator("td.progress")
            first = _done(progress.inner_text())
            wait_until(lambda: _done(progress.inner_text()) > first, 60, "the batch to progress")
            expect(page.locator('#usage tr[data-tenant="acme"]')).to_be_visible()
            row.locator("button", has_text="Cancel").click()
            expect(row).to_contain_text("cancelled", timeout=30_000)
            page.screenshot(path=str(Path("/tmp/tokenq-dashboard-batches.png")), full_page=True)
        finally:
            browser.close()  # type: ignore[attr-defined]
    assert errors == [], f"the page raised: {errors}"
    status = batches.status(batch_id)
    assert status.state is BatchState.CANCELLED
    assert status.counts.completed < NUM_LINES


def _done(cell: str) -> int:
    """The lines done, from the progress cell's 'done/total'."""
    return int(cell.strip().split("/")[0])
