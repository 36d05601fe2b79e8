"""Who may look and who may act, as a caller of the HTTP API sees it."""

from __future__ import annotations

import pytest

from tests.producer.dashboard.conftest import AppFactory, World, http


async def test_viewing_needs_the_token(make_app: AppFactory) -> None:
    async with http(make_app(), token=None) as client:
        reply = await client.get("/admin/api/overview")
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == "Bearer"
    assert reply.json()["error"]["message"].startswith("admin token required to view")


async def test_a_wrong_token_is_refused_with_a_clear_message(make_app: AppFactory) -> None:
    async with http(make_app(), token="guess") as client:
        for reply in (
            await client.get("/admin/api/overview"),
            await client.get("/admin/api/access"),
        ):
            assert reply.status_code == 403
            assert reply.json()["error"]["message"] == "wrong admin token: check TOKENQ_ADMIN_TOKEN"


async def test_the_token_opens_views_and_actions(make_app: AppFactory, fake_world: World) -> None:
    [rid] = fake_world.submit(1)
    async with http(make_app()) as client:
        assert (await client.get("/admin/api/access")).json() == {
            "can_view": True,
            "can_act": True,
            "read_only_view": False,
            "token_configured": True,
        }
        assert (await client.get("/admin/api/overview")).status_code == 200
        reply = await client.post(f"/admin/api/requests/{rid}/cancel")
    assert reply.json() == {"id": rid, "result": "cancelled"}


async def test_read_only_view_shows_but_refuses_actions(
    make_app: AppFactory, fake_world: World
) -> None:
    [rid] = fake_world.submit(1)
    async with http(make_app(read_only_view=True), token=None) as client:
        access = (await client.get("/admin/api/access")).json()
        view = await client.get("/admin/api/overview")
        act = await client.post(f"/admin/api/requests/{rid}/cancel")
    assert (access["can_view"], access["can_act"], access["read_only_view"]) == (True, False, True)
    assert view.status_code == 200
    assert act.status_code == 401
    assert act.json()["error"]["message"].startswith("read-only view: actions need the admin token")
    assert fake_world.client.handle(rid).status().state == "queued"


@pytest.mark.parametrize("read_only_view", [False, True])
async def test_no_token_configured(make_app: AppFactory, read_only_view: bool) -> None:
    app = make_app(token=None, read_only_view=read_only_view)
    async with http(app, token=None) as client:
        view = await client.get("/admin/api/overview")
        act = await client.post("/admin/api/dead/purge")
    if read_only_view:
        assert (view.status_code, act.status_code) == (200, 401)
    else:
        assert (view.status_code, act.status_code) == (503, 503)
        assert "set TOKENQ_ADMIN_TOKEN" in view.json()["error"]["message"]


async def test_the_page_itself_loads_without_a_token(make_app: AppFactory) -> None:
    async with http(make_app(), token=None) as client:
        bare = await client.get("/admin")
        page = await client.get("/admin/")
        script = await client.get("/admin/static/main.js")
        chart = await client.get("/admin/static/vendor/uPlot.iife.min.js")
        missing = await client.get("/admin/static/../config.py")
    assert bare.status_code == 307 and bare.headers["location"].endswith("/admin/")
    assert page.headers["content-type"].startswith("text/html")
    assert "tokenq admin" in page.text
    assert script.headers["content-type"].startswith("text/javascript")
    assert chart.status_code == 200
    assert missing.status_code == 404
