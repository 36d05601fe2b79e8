"""Several simulated workers (worker.sim) in threads of the test process, each with its
own connection, claiming from a real redis-server as separate worker processes would."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from shared.connection import connect
from shared.settings import Settings
from worker.service import WorkerService
from worker.sim import SimConfig, SimEngine


@contextmanager
def sim_fleet(url: str, model: str, num_workers: int, settings: Settings) -> Iterator[None]:
    services = [
        WorkerService(
            SimEngine(SimConfig.parse(model)),
            connect(url),
            settings,
            model,
            f"sim-{n}",
        )
        for n in range(num_workers)
    ]
    threads = [threading.Thread(target=s.run, daemon=True) for s in services]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        for s in services:
            s.stopping.set()
        for t in threads:
            t.join(timeout=30)
        for s in services:
            s.queue.redis.close()
