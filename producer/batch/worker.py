"""The RQ worker that runs batch chains and webhook deliveries (``tokenq batch worker``)."""

from __future__ import annotations

import redis
from rq import SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.worker import DequeueStrategy

from producer.batch.context import Context
from shared.settings import Settings


class BatchWorker(SimpleWorker):
    """Runs jobs in its own process (no fork per job: ticks are short and frequent).

    RQ retries a job whose worker died once the job's heartbeat runs out; RQ's
    default (job timeout + 60 s, seen at the next maintenance, every 10 min) is
    shortened here to the job timeout plus ``batch_heartbeat_grace_s``, seen every
    ``rq_maintenance_s``, so a batch resumes within seconds of a worker restart.
    """

    heartbeat_grace_s = 30

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        return int(job.timeout or 0) + self.heartbeat_grace_s

    def _set_ip_address(self, connection: redis.Redis) -> None:
        """As RQ does, except on a server whose CLIENT INFO reply redis-py cannot read
        (fakeredis, which `tokenq up` runs where there is no redis-server)."""
        try:
            super()._set_ip_address(connection)
        except ValueError:
            self.ip_address = "unknown"


def make_worker(connection: redis.Redis, batch: Settings, ctx: Context) -> BatchWorker:
    queues = [ctx.batch_queue(), ctx.webhook_queue()]
    worker = BatchWorker(
        queues,
        connection=connection,
        serializer=JSONSerializer,
        maintenance_interval=batch.rq_maintenance_s,
        # RQ blocks on its queues for worker_ttl - 15 s between maintenance runs.
        worker_ttl=batch.rq_maintenance_s + 15,
    )
    worker.heartbeat_grace_s = batch.batch_heartbeat_grace_s
    return worker


def run_worker(
    ctx: Context, *, burst: bool = False, with_scheduler: bool = True, logging_level: str = "INFO"
) -> None:
    """Work the batch and webhook queues; the scheduler runs retries that wait (backoff)."""
    worker = make_worker(ctx.redis, ctx.settings, ctx)
    # Round robin, so a stream of batch ticks never starves webhook deliveries (or back).
    worker.work(
        burst=burst,
        with_scheduler=with_scheduler,
        logging_level=logging_level,
        dequeue_strategy=DequeueStrategy.ROUND_ROBIN,
    )
