"""The web app's side of bench/scale.py, run as its own process: keeps the queue
topped up and follows every request's stream from submit to its final event, as a
gateway serving SSE does (the gateway's stream hub: one blocking XREAD for all the
streams on one Redis; on a cluster, rounds of one XREAD per followed slot per master).

    python -m bench.webapp URL MODEL DEPTH MAX_TOKENS GATHER_MS

Runs until terminated.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from producer.aio import AsyncClient
from producer.gateway.hub import gateway_hub
from shared.connection import connect_async
from shared.errors import QueueFull, ReplicationTimeout
from shared.keys import Keys, model_tag
from shared.settings import Settings

FEED_EVERY_S = 0.05


class WebApp:
    def __init__(self, url: str, model: str, depth: int, max_tokens: int, gather_s: float) -> None:
        self.settings = Settings(redis_url=url, max_queued=1_000_000)
        self.client = AsyncClient(settings=self.settings)
        self.hub = gateway_hub(connect_async(url), gather_s=gather_s, keys=Keys())
        self.model, self.depth = model, depth
        self.body = {"model": model, "prompt": "a b c d", "sampling": {"max_tokens": max_tokens}}
        self.queue_key = Keys().queue(model_tag(model))
        self.num_tokens = self.num_finals = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def feed(self) -> None:
        self.hub.start()
        while True:
            missing = self.depth - int(await self.client.redis.zcard(self.queue_key))
            if missing > 0:
                with contextlib.suppress(QueueFull, ReplicationTimeout):
                    for handle in await self.client.submit_many([self.body] * missing):
                        self._follow(Keys().stream(handle.id))
            await asyncio.sleep(FEED_EVERY_S)

    def _follow(self, key: str) -> None:
        task = asyncio.ensure_future(self.follow(key))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def follow(self, key: str) -> None:
        async for batch in self.hub.subscribe(key):
            for entry in batch:
                if entry.is_final:
                    self.num_finals += 1
                    return
                self.num_tokens += len(entry.token().token_ids)


async def run(url: str, model: str, depth: int, max_tokens: int, gather_s: float) -> None:
    await WebApp(url, model, depth, max_tokens, gather_s).feed()  # until the bench ends us


if __name__ == "__main__":
    url, model, depth, max_tokens, gather_ms = sys.argv[1:6]
    asyncio.run(run(url, model, int(depth), int(max_tokens), float(gather_ms) / 1000))
