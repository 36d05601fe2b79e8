"""The functions RQ runs, by import path. Arguments are plain strings (JSON-serialized).

Each builds its context from the job's connection and the environment's settings.
"""

from __future__ import annotations

from rq import get_current_job
from rq.job import Job

from producer.batch import chain, driver, watch, webhooks
from producer.batch.context import Context, job_context
from producer.batch.ops import batch_chain
from shared.errors import NotFound
from shared.settings import get_settings


def advance_batch(batch_id: str) -> str:
    """One tick of a batch's chain."""
    job, ctx = _job_and_context()
    try:
        if driver.run_tick(ctx, batch_id, job.id):
            return "ended"
    except NotFound:
        return "the batch has expired"
    except Exception as e:
        # Shown by `tokenq batch status` while RQ retries; cleared by the next good tick.
        ctx.redis.hset(ctx.bkeys.meta(batch_id), "error", f"{type(e).__name__}: {e}"[:500])
        raise
    ctx.redis.hdel(ctx.bkeys.meta(batch_id), "error")
    next_id = chain.hand_over(ctx, batch_chain(ctx, batch_id), job.id)
    return f"handed over to {next_id}" if next_id else "superseded"


def watch_requests() -> str:
    """One tick of the request watcher's chain."""
    job, ctx = _job_and_context()
    if watch.run_tick(ctx, job.id):
        return "ended"
    next_id = chain.hand_over(ctx, watch.watcher_chain(ctx), job.id)
    return f"handed over to {next_id}" if next_id else "superseded"


def deliver_webhook(delivery_id: str) -> str:
    """One attempt of a delivery; raises so that RQ retries it with backoff."""
    job, ctx = _job_and_context()
    last_attempt = not job.retries_left
    return webhooks.deliver(ctx, delivery_id, last_attempt=last_attempt).value


def _job_and_context() -> tuple[Job, Context]:
    job = get_current_job()
    if job is None:
        raise RuntimeError("this function runs inside an RQ worker (tokenq batch worker)")
    return job, job_context(job.connection, get_settings())
