"""The admin routes for LoRA adapters (under the gateway: /admin/api/loras): anyone
who may view lists them; only the admin token registers and unregisters."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer.client import Client
from shared.errors import UnknownAdapter
from tests.lora_files import write_peft_dir
from tests.producer.dashboard.conftest import MODEL, AppFactory, World, http

POET = {"model": MODEL, "name": "poet", "path": "/adapters/poet", "rank": 8}


async def test_register_list_and_unregister(make_app: AppFactory, world: World) -> None:
    async with http(make_app(world)) as client:
        added = await client.post("/admin/api/loras", json=POET)
        listed = await client.get("/admin/api/loras")
        client_sees = Client(connection=world.sync).submit("hi", model=MODEL, lora="poet")
        removed = await client.delete("/admin/api/loras/poet", params={"model": MODEL})
        again = await client.delete("/admin/api/loras/poet", params={"model": MODEL})
    assert added.status_code == 201
    assert added.json()["replaced"] is False
    assert [(a["model"], a["name"], a["path"]) for a in listed.json()] == [
        (MODEL, "poet", "/adapters/poet")
    ]
    assert client_sees.position() == 0
    assert removed.json() == {"model": MODEL, "name": "poet", "removed": True}
    assert again.status_code == 404
    assert again.json()["error"]["code"] == "lora_not_found"
    with pytest.raises(UnknownAdapter):
        Client(connection=world.sync).submit("hi", model=MODEL, lora="poet")


async def test_registering_needs_the_admin_token(make_app: AppFactory) -> None:
    app = make_app(read_only_view=True)
    async with http(app, token=None) as client:
        refused = await client.post("/admin/api/loras", json=POET)
        listed = await client.get("/admin/api/loras")
    assert refused.status_code == 401
    assert "need the admin token" in refused.json()["error"]["message"]
    assert listed.status_code == 200
    assert listed.json() == []


async def test_a_bad_adapter_is_refused_saying_why(make_app: AppFactory) -> None:
    async with http(make_app()) as client:
        relative = await client.post("/admin/api/loras", json={**POET, "path": "rel/poet"})
        colon = await client.post("/admin/api/loras", json={**POET, "name": "a:b"})
    assert relative.status_code == 400
    assert "give an absolute path" in relative.json()["error"]["message"]
    assert colon.status_code == 400
    assert "name: String should match pattern" in colon.json()["error"]["message"]


async def test_the_rank_is_read_from_the_adapter_or_taken_as_given(
    make_app: AppFactory, tmp_path: Path
) -> None:
    clerk = {"model": MODEL, "name": "clerk", "path": str(write_peft_dir(tmp_path / "c", 4))}
    elsewhere = {"model": MODEL, "name": "poet", "path": "/only/on/the/workers/poet"}
    async with http(make_app()) as client:
        read = await client.post("/admin/api/loras", json=clerk)
        wrong = await client.post("/admin/api/loras", json={**clerk, "rank": 8})
        unknown = await client.post("/admin/api/loras", json=elsewhere)
        given = await client.post("/admin/api/loras", json={**elsewhere, "rank": 32})
        listed = await client.get("/admin/api/loras")
    assert read.status_code == 201 and read.json()["rank"] == 4
    assert wrong.status_code == 400 and "has rank 4, not 8" in wrong.json()["error"]["message"]
    assert unknown.status_code == 400
    assert "cannot read the rank of the LoRA adapter" in unknown.json()["error"]["message"]
    assert given.status_code == 201
    assert [(a["name"], a["rank"]) for a in listed.json()] == [("clerk", 4), ("poet", 32)]
