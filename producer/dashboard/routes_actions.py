"""The operator's actions; each needs the admin token, read-only view or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from starlette.requests import Request

from producer.dashboard.actions import check_request_id
from producer.dashboard.auth import require_act
from producer.dashboard.service import Dashboard

MAX_PURGE = 100_000


def add_routes(router: APIRouter, dash: Dashboard) -> None:
    async def operator(request: Request) -> AsyncIterator[None]:
        require_act(dash.config, request)
        yield
        dash.refresh()  # the next live push shows the action's effect

    act = [Depends(operator)]

    @router.post("/api/requests/{request_id}/cancel", dependencies=act)
    async def cancel(request_id: str) -> dict[str, Any]:
        """result: 'cancelled' (was queued), 'requested' (running; stops within a step),
        or 'done' (had already ended)."""
        return {"id": request_id, "result": await dash.admin.cancel(check_request_id(request_id))}

    @router.post("/api/batches/{batch_id}/cancel", dependencies=act)
    async def cancel_batch(batch_id: str) -> dict[str, Any]:
        """Stop a batch: its queued lines are removed, running ones stop within a step;
        state: 'cancelling' (its driver ends it shortly), or the state it had ended in."""
        return {"id": batch_id, "state": await dash.admin.cancel_batch(dash.bkeys, batch_id)}

    @router.post("/api/requests/{request_id}/retry", dependencies=act)
    async def retry(request_id: str) -> dict[str, Any]:
        await dash.admin.retry(check_request_id(request_id))
        return {"id": request_id, "result": "queued"}

    @router.post("/api/dead/purge", dependencies=act)
    async def purge(
        tag: str | None = None, limit: Annotated[int, Query(ge=1, le=MAX_PURGE)] = MAX_PURGE
    ) -> dict[str, Any]:
        """Delete dead-lettered requests (of one queue, or all) with their streams."""
        tags = list(await dash.tags()) if tag is None else [tag]
        if tag is not None:
            await dash.admin.model_of(tag)
        return {"purged": await dash.admin.purge_dead(tags, limit)}

    @router.post("/api/queues/{tag}/pause", dependencies=act)
    async def pause(tag: str) -> dict[str, Any]:
        await dash.admin.set_paused(tag, True)
        return {"tag": tag, "paused": True}

    @router.post("/api/queues/{tag}/resume", dependencies=act)
    async def resume(tag: str) -> dict[str, Any]:
        await dash.admin.set_paused(tag, False)
        return {"tag": tag, "paused": False}

    @router.post("/api/workers/{worker_id}/drain", dependencies=act)
    async def drain(worker_id: str) -> dict[str, Any]:
        await dash.admin.drain(worker_id)
        return {"worker": worker_id, "draining": True}
