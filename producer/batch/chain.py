"""Chains of short RQ jobs: one drives a batch, one watches requests for webhooks.

Each job runs for about ``batch_tick_s`` and hands over to the next. A hash field
(``driver``) names the chain's one current job; a job that is not it stands down,
so a job that RQ retries after its worker died, or one replaced by ``resume``,
never runs beside its successor. The handover enqueues the next job and names it
in one MULTI, so a crash leaves either the old job (which RQ retries) or the new one.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import redis
from rq import Retry
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from producer.batch.context import Context
from shared.replies import text

MAX_WATCH_TRIES = 5
# Retries cover a dead RQ worker (RQ retries an abandoned job) and Redis blips.
TICK_RETRIES = 10
DRIVER = "driver"
ALIVE = (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED, JobStatus.DEFERRED)


@dataclass(frozen=True)
class Chain:
    key: str  # a hash whose field ``driver`` names the current job
    func: str  # import path of the job function
    args: tuple[str, ...]
    prefix: str  # job ids are ``<prefix>-<random>``


def start(ctx: Context, chain: Chain, pipe: redis.client.Pipeline | None = None) -> str:
    """Make a new job the chain's driver (a running one stands down at its next check)."""
    if pipe is not None:
        return _enqueue(ctx, chain, pipe)
    with ctx.redis.pipeline(transaction=True) as own:
        own.multi()
        job_id = _enqueue(ctx, chain, own)
        own.execute()
    return job_id


def ensure(ctx: Context, chain: Chain) -> None:
    """Start the chain unless a live job drives it."""
    with ctx.redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(chain.key)  # type: ignore[no-untyped-call]
            current = pipe.hget(chain.key, DRIVER)
            if current and is_alive(ctx, text(current)):
                return
            pipe.multi()
            start(ctx, chain, pipe)
            pipe.execute()
        except redis.WatchError:
            return  # someone else started it meanwhile


def hand_over(ctx: Context, chain: Chain, from_job: str) -> str | None:
    """The next job's id, or None when ``from_job`` no longer drives the chain."""
    for _ in range(MAX_WATCH_TRIES):
        with ctx.redis.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(chain.key)  # type: ignore[no-untyped-call]
                if text(pipe.hget(chain.key, DRIVER) or b"") != from_job:
                    return None
                pipe.multi()
                job_id = start(ctx, chain, pipe)
                pipe.execute()
                return job_id
            except redis.WatchError:
                continue  # the hash changed (a cancel, say): look again
    raise RuntimeError(f"{chain.key}: could not hand over after {MAX_WATCH_TRIES} tries")


def is_driver(ctx: Context, chain: Chain, job_id: str) -> bool:
    return text(ctx.redis.hget(chain.key, DRIVER) or b"") == job_id


def is_alive(ctx: Context, job_id: str) -> bool:
    try:
        job = Job.fetch(job_id, connection=ctx.redis, serializer=JSONSerializer)
    except NoSuchJobError:
        return False
    return job.get_status() in ALIVE


def _enqueue(ctx: Context, chain: Chain, pipe: redis.client.Pipeline) -> str:
    b, job_id = ctx.settings, f"{chain.prefix}-{secrets.token_hex(6)}"
    ctx.batch_queue().enqueue_call(
        chain.func,
        args=list(chain.args),
        job_id=job_id,
        timeout=b.batch_job_timeout_s,
        retry=Retry(max=TICK_RETRIES),
        result_ttl=60,
        failure_ttl=b.batch_ttl_s,
        description=f"{chain.func.rsplit('.', 1)[-1]} {' '.join(chain.args)}",
        pipeline=pipe,
    )
    pipe.hset(chain.key, DRIVER, job_id)
    return job_id
