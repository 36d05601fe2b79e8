"""`tokenq lora add | list | remove` against a real redis-server, and `submit --lora`."""

from __future__ import annotations

from pathlib import Path

import redis
from typer.testing import CliRunner

from producer.cli import app
from producer.embedded import EmbeddedRedis
from shared.keys import Keys
from shared.loras import list_loras
from tests.conftest import serve
from tests.lora_files import write_peft_dir, write_safetensors

runner = CliRunner()
MODEL = "SmolLM2-135M-Instruct"


def test_add_list_remove(
    real_redis: redis.Redis, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    adapter = write_peft_dir(tmp_path / "poet", rank=8)
    url = ["--redis", redis_server.url]
    added = runner.invoke(app, ["lora", "add", MODEL, "poet", str(adapter), *url])
    assert added.exit_code == 0, added.output
    assert f"registered {MODEL}:poet -> {adapter} (rank 8)" in added.stdout
    assert [(a.name, a.path, a.rank) for a in list_loras(real_redis, Keys(), MODEL)] == [
        ("poet", str(adapter), 8)
    ]
    listed = runner.invoke(app, ["lora", "list", "--model", MODEL, *url])
    assert f"{MODEL}:poet  {adapter}  rank 8" in listed.stdout
    removed = runner.invoke(app, ["lora", "remove", MODEL, "poet", *url])
    assert removed.exit_code == 0
    again = runner.invoke(app, ["lora", "remove", MODEL, "poet", *url])
    assert again.exit_code == 1
    assert "no LoRA adapter 'poet' is registered" in again.output


def test_bad_adapters_and_unknown_ones_are_refused(
    real_redis: redis.Redis, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    serve(real_redis, MODEL)
    url = ["--redis", redis_server.url]
    not_peft = runner.invoke(app, ["lora", "add", MODEL, "poet", str(tmp_path), *url])
    assert not_peft.exit_code == 1
    assert "without adapter_config.json" in not_peft.output
    bad_name = runner.invoke(app, ["lora", "add", MODEL, "a:b", "/somewhere/else", *url])
    assert bad_name.exit_code == 1
    assert "name: String should match pattern" in bad_name.output
    submitted = runner.invoke(app, ["submit", "hi", "--lora", "poet", *url])
    assert submitted.exit_code == 1
    assert "'poet' is not registered for model" in submitted.output
    assert list_loras(real_redis, Keys(), MODEL) == []


def test_the_rank_is_read_from_the_adapter_or_given_for_one_only_workers_see(
    real_redis: redis.Redis, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    url = ["--redis", redis_server.url]
    bare = write_safetensors(tmp_path / "clerk.safetensors", rank=4)
    runner.invoke(app, ["lora", "add", MODEL, "clerk", str(bare), *url])
    elsewhere = ["lora", "add", MODEL, "pirate", "/on/the/workers/pirate", *url]
    unknown = runner.invoke(app, elsewhere)
    assert unknown.exit_code == 1
    assert "cannot read the rank of the LoRA adapter at /on/the/workers/pirate" in unknown.output
    assert "--rank" in unknown.output
    given = runner.invoke(app, [*elsewhere, "--rank", "32"])
    assert given.exit_code == 0, given.output
    wrong = runner.invoke(app, ["lora", "add", MODEL, "clerk", str(bare), "--rank", "8", *url])
    assert wrong.exit_code == 1
    assert "has rank 4, not 8" in wrong.output
    ranks = {a.name: a.rank for a in list_loras(real_redis, Keys(), MODEL)}
    assert ranks == {"clerk": 4, "pirate": 32}
