"""Operator actions over redis.asyncio, through the same scripts and keys as
``producer.admin.Admin``: cancel, retry a dead request, purge dead-letter, pause and
resume a queue, drain a worker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from producer.batch.chain import MAX_WATCH_TRIES
from producer.batch.collect import Pending
from producer.batch.models import BatchState
from producer.dashboard.errors import Conflict, NotFoundError
from shared.flows import cancel_flow, drive_async, ended_flow, retry_flow
from shared.keys import BatchKeys, Keys, check_batch_id, tag_of
from shared.ops.moves import EndScript
from shared.replies import text
from shared.scripts import AsyncScripts
from shared.settings import Settings

PURGE_BATCH = 500
# A drain order waits this long for its worker's next heartbeat, then lapses.
DRAIN_ORDER_TTL_S = 3600


@dataclass
class AsyncAdmin:
    redis: redis.asyncio.Redis
    keys: Keys
    settings: Settings
    scripts: AsyncScripts

    async def cancel(self, request_id: str) -> str:
        """'cancelled' (was queued), 'requested' (running: stops within a step) or 'done'."""
        flow = cancel_flow(self.keys, self.settings, request_id)
        return await drive_async(self.scripts, flow)

    async def retry(self, request_id: str) -> None:
        if not await drive_async(self.scripts, retry_flow(self.keys, request_id)):
            raise Conflict(
                f"request {request_id} is not in the dead-letter set; only dead "
                "requests can be retried",
                "not_dead",
            )

    async def purge_dead(self, tags: list[str], max_requests: int) -> int:
        """Delete dead-lettered requests with their streams, at most ``max_requests``."""
        purged = 0
        for tag in tags:
            while purged < max_requests:
                batch = await self._purge_batch(tag, min(PURGE_BATCH, max_requests - purged))
                purged += batch
                if batch == 0:
                    break
        return purged

    async def _purge_batch(self, tag: str, count: int) -> int:
        ids = [text(m) for m in await self.redis.zrange(self.keys.dead(tag), 0, count - 1)]
        pipe = self.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.delete(self.keys.request(rid), self.keys.stream(rid))
            pipe.zrem(self.keys.dead(tag), rid)
            pipe.zrem(self.keys.lora_ranks(tag), rid)  # kept while dead-lettered (settle.lua)
        await pipe.execute()
        return len(ids)

    async def cancel_batch(self, bkeys: BatchKeys, batch_id: str) -> str:
        """As ``Batches.cancel`` over this connection: mark the batch cancelling (its
        driver ends it on its next round) and cancel its lines in flight now. Returns its
        state: 'cancelling', or the state it had already ended in."""
        state = await self._mark_cancelling(bkeys.meta(check_batch_id(batch_id)), batch_id)
        if state != BatchState.CANCELLING:
            return state
        pending = await self.redis.hvals(bkeys.pending(batch_id))
        ids = [i for value in pending for i in Pending.decode(value).ids]
        await drive_async(self.scripts, ended_flow(self.keys, self.settings, EndScript.CANCEL, ids))
        return state

    async def _mark_cancelling(self, meta: str, batch_id: str) -> str:
        async with self.redis.pipeline(transaction=True) as pipe:
            for _ in range(MAX_WATCH_TRIES):
                try:
                    await pipe.watch(meta)
                    state = await pipe.hget(meta, "state")
                    if state is None:
                        raise NotFoundError(f"batch {batch_id} does not exist", "batch_not_found")
                    if text(state) != BatchState.IN_PROGRESS:
                        return text(state)
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.hset(meta, "state", BatchState.CANCELLING.value)
                    await pipe.execute()
                    return BatchState.CANCELLING.value
                except redis.WatchError:
                    continue
        raise Conflict(f"batch {batch_id} kept changing; try the cancel again", "busy")

    async def set_paused(self, tag: str, paused: bool) -> None:
        """Paused: workers stop claiming from the queue (what they hold runs on)."""
        await self.model_of(tag)
        key = self.keys.paused(tag)
        await (self.redis.set(key, 1) if paused else self.redis.delete(key))

    async def drain(self, worker_id: str) -> None:
        """The worker finishes what it holds, stops claiming and exits."""
        if not await self.redis.exists(self.keys.worker(worker_id)):
            raise NotFoundError(f"worker {worker_id} is not live", "worker_not_found")
        await self.redis.set(self.keys.worker_control(worker_id), "drain", ex=DRAIN_ORDER_TTL_S)

    async def model_of(self, tag: str) -> str:
        model: Any = await self.redis.hget(self.keys.models(), tag)
        if model is None:
            raise NotFoundError(f"no model has queue tag {tag!r}", "queue_not_found")
        return text(model)


def check_request_id(request_id: str) -> str:
    tag_of(request_id)  # raises InvalidRequest with what a well-formed id looks like
    return request_id
