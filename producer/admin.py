"""Operator actions over Redis: the dead-letter set, queue pause and resume."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from producer.client import Client
from shared.flows import drive, retry_flow
from shared.keys import model_tag
from shared.records import STATUS_FIELDS, decode_hash
from shared.registry import known_models
from shared.replies import text


@dataclass(frozen=True)
class DeadEntry:
    request_id: str
    model: str
    dead_ms: int
    reason: str


class Admin:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.redis = client.redis
        self.keys = client.keys

    def tags(self) -> dict[str, str]:
        return known_models(self.redis, self.keys)

    def dead(self, limit: int = 100) -> list[DeadEntry]:
        entries: list[DeadEntry] = []
        for tag, model in self.tags().items():
            rows: Any = self.redis.zrange(self.keys.dead(tag), 0, limit - 1, withscores=True)
            for member, score in rows:
                rid = text(member)
                reason = self.redis.hget(self.keys.request(rid), "dead_reason")
                entries.append(DeadEntry(rid, model, int(score), text(reason or b"")))
        return sorted(entries, key=lambda e: e.dead_ms)[:limit]

    def retry(self, request_id: str) -> bool:
        """Queue a dead-lettered request again; False if it is not dead-lettered."""
        return drive(self.client._scripts, retry_flow(self.keys, request_id))

    def purge(self) -> int:
        """Delete every dead-lettered request with its stream; returns how many."""
        purged = 0
        for tag in self.tags():
            ids = [text(m) for m in self.redis.zrange(self.keys.dead(tag), 0, -1)]
            pipe = self.redis.pipeline(transaction=False)
            for rid in ids:
                # One key per DEL: a cluster pipeline refuses a multi-key DEL.
                pipe.delete(self.keys.request(rid))
                pipe.delete(self.keys.stream(rid))
                pipe.zrem(self.keys.dead(tag), rid)
                pipe.zrem(self.keys.lora_ranks(tag), rid)  # kept while dead-lettered (settle.lua)
            pipe.execute()
            purged += len(ids)
        return purged

    def set_paused(self, model: str, paused: bool) -> None:
        key = self.keys.paused(model_tag(model))
        self.redis.set(key, 1) if paused else self.redis.delete(key)

    def status_fields(self, request_id: str) -> dict[str, Any]:
        raw = self.redis.hmget(self.keys.request(request_id), STATUS_FIELDS)
        return dict(decode_hash(raw, STATUS_FIELDS))
