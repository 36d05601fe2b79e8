"""The dashboard's routes: the page, its files, and the JSON and SSE API it reads.

Mount the router under ``/admin``; every path below is relative to that.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from producer.dashboard import routes_actions, routes_loras
from producer.dashboard.auth import Access, access_for, require_view
from producer.dashboard.config import DashboardConfig, load_config
from producer.dashboard.errors import DashboardError, DashboardRoute, NotFoundError
from producer.dashboard.live import overview_events, request_events
from producer.dashboard.requests import ListKind, RequestDetail, RequestRow, request_detail
from producer.dashboard.requests import request_list as list_requests
from producer.dashboard.service import Dashboard, Overview, RedisSource
from producer.dashboard.static_files import load_static
from shared.settings import Settings

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CURSOR_RE = re.compile(r"^\d+-\d+$")


def create_dashboard_router(
    settings: Settings, redis_async: RedisSource, config: DashboardConfig | None = None
) -> APIRouter:
    """The dashboard as a router to mount under ``/admin``. ``redis_async`` is a
    connection, or a function giving one (called on first use, so a host app can open
    its pool in its own lifespan). The router's lifespan runs the history sampler."""
    dash = Dashboard(settings, config or load_config(settings), redis_async)
    router = APIRouter(route_class=DashboardRoute, lifespan=dash.lifespan)
    _add_page_routes(router)
    _add_view_routes(router, dash)
    routes_actions.add_routes(router, dash)
    routes_loras.add_routes(router, dash)
    return router


def _add_page_routes(router: APIRouter) -> None:
    files = load_static()

    @router.get("", include_in_schema=False)
    async def bare(request: Request) -> Response:
        return RedirectResponse(request.url.path + "/")

    @router.get("/", include_in_schema=False)
    async def page() -> Response:
        index = files["index.html"]
        return Response(index.body, media_type=index.media_type, headers=_NO_STORE)

    @router.get("/static/{name:path}", include_in_schema=False)
    async def static(name: str) -> Response:
        found = files.get(name)
        if found is None:
            raise NotFoundError(f"no dashboard file {name!r}", "file_not_found")
        return Response(found.body, media_type=found.media_type, headers=_NO_STORE)


_NO_STORE = {"Cache-Control": "no-cache"}


def viewer(dash: Dashboard) -> Callable[[Request], Access]:
    def view(request: Request) -> Access:
        return require_view(dash.config, request)

    return view


def _add_view_routes(router: APIRouter, dash: Dashboard) -> None:
    view = [Depends(viewer(dash))]

    @router.get("/api/access")
    async def access(request: Request) -> dict[str, Any]:
        """What this caller may do (403 for a wrong token)."""
        return vars(access_for(dash.config, request))

    @router.get("/api/overview", dependencies=view)
    async def overview() -> Overview:
        return await dash.overview()

    @router.get("/api/live", dependencies=view)
    async def live() -> StreamingResponse:
        return _sse(overview_events(dash))

    @router.get("/api/history", dependencies=view)
    async def history(
        window_s: Annotated[float, Query(gt=0, le=7 * 24 * 3600)] = 3600,
    ) -> list[dict[str, Any]]:
        return await dash.history(window_s)

    @router.get("/api/requests", dependencies=view)
    async def requests(
        kind: ListKind = "running", limit: Annotated[int, Query(ge=1, le=500)] = 50
    ) -> list[RequestRow]:
        return await list_requests(dash.redis, dash.keys, list(await dash.tags()), kind, limit)

    @router.get("/api/requests/{request_id}", dependencies=view)
    async def detail(request_id: str) -> RequestDetail:
        return await request_detail(dash.redis, dash.keys, request_id)

    @router.get("/api/requests/{request_id}/stream", dependencies=view)
    async def stream(request: Request, request_id: str, after: str = "0-0") -> StreamingResponse:
        cursor = request.headers.get("last-event-id") or after
        if not CURSOR_RE.match(cursor):
            raise DashboardError(
                f"bad stream cursor {cursor!r}: expected a stream id like '1700000000000-0'",
                "bad_cursor",
            )
        await request_detail(dash.redis, dash.keys, request_id)  # 404 before streaming
        return _sse(request_events(dash, request_id, cursor))


def _sse(body: Any) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)
