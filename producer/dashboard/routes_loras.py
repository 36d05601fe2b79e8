"""LoRA adapters: list them (a viewer), register and unregister them (the admin token).

Under the gateway these are its admin routes (``/admin/api/loras``); the dashboard's
page calls the same ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel
from starlette.requests import Request

from producer.dashboard.auth import require_act, require_view
from producer.dashboard.errors import NotFoundError
from producer.dashboard.service import Dashboard
from shared.loras import list_loras_async, new_adapter, register_lora_async, remove_lora_async


class LoraBody(BaseModel):
    model: str
    name: str
    path: str
    rank: int | None = None  # read from ``path`` when the gateway's host can see it


def add_routes(router: APIRouter, dash: Dashboard) -> None:
    async def viewer(request: Request) -> None:
        require_view(dash.config, request)

    async def operator(request: Request) -> AsyncIterator[None]:
        require_act(dash.config, request)
        yield
        dash.refresh()

    @router.get("/api/loras", dependencies=[Depends(viewer)])
    async def loras(model: str | None = None) -> list[dict[str, Any]]:
        """The adapters registered for ``model``, or for every model a worker has served."""
        models = [model] if model else sorted(set((await dash.tags()).values()))
        found = await list_loras_async(dash.redis, dash.keys, models)
        return [a.model_dump() for m in models for a in found.get(m, [])]

    @router.post("/api/loras", dependencies=[Depends(operator)], status_code=201)
    async def register(body: LoraBody) -> dict[str, Any]:
        """Register (or replace) an adapter: a PEFT directory or a safetensors file at a
        path the model's workers can read; they load it when a request needs it. Its
        rank is read from the path, or given as ``rank`` when only the workers see it."""
        fields = (body.model, body.name, body.path, body.rank)
        adapter = await asyncio.to_thread(new_adapter, *fields)  # reads the weights' header
        added = await register_lora_async(dash.redis, dash.keys, adapter)
        return {**adapter.model_dump(), "replaced": not added}

    @router.delete("/api/loras/{name}", dependencies=[Depends(operator)])
    async def unregister(name: str, model: Annotated[str, Query()]) -> dict[str, Any]:
        if not await remove_lora_async(dash.redis, dash.keys, model, name):
            raise NotFoundError(
                f"no LoRA adapter {name!r} is registered for model {model!r}", "lora_not_found"
            )
        return {"model": model, "name": name, "removed": True}
