"""What every batch operation and RQ job needs: connections, settings and key names.

Batches keep their records and RQ's queues on one Redis (``redis``) and reach tokenq's
requests through another (``tokenq``): the same one, unless tokenq runs on a Redis
Cluster, which RQ does not support; then batches need ``TOKENQ_BATCH_REDIS_URL``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import redis
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from shared.connection import cluster_url, connect, is_cluster
from shared.errors import TokenqError
from shared.keys import BatchKeys, Keys
from shared.limits import LimitsCache
from shared.replication import Replicas
from shared.scripts import Scripts
from shared.settings import Settings, get_settings


class BatchRedisRequired(TokenqError):
    """tokenq runs on a Redis Cluster and no plain Redis is configured for batches."""

    def __init__(self) -> None:
        super().__init__(
            "batches need a plain Redis when tokenq runs on a Redis Cluster (RQ does not "
            "support Redis Cluster): set TOKENQ_BATCH_REDIS_URL to one"
        )


@dataclass
class Context:
    redis: redis.Redis  # batch records and RQ
    settings: Settings = field(default_factory=get_settings)
    tokenq: Redis | None = None  # tokenq's requests; default: ``redis``

    def __post_init__(self) -> None:
        self.keys = Keys(self.settings.namespace)
        self.bkeys = BatchKeys(self.settings.namespace)
        self.main: Redis = self.tokenq if self.tokenq is not None else self.redis
        self.scripts = Scripts(self.main, Replicas.of(self.settings))
        self.limits = LimitsCache(self.main, self.keys)  # what the models' workers take

    def batch_queue(self) -> Queue:
        return rq_queue(self.redis, self.bkeys.batch_queue())

    def webhook_queue(self) -> Queue:
        return rq_queue(self.redis, self.bkeys.webhook_queue())


def rq_queue(connection: redis.Redis, name: str) -> Queue:
    """An RQ queue that stores job arguments as JSON: nothing is pickled."""
    return Queue(name, connection=connection, serializer=JSONSerializer)


def batch_redis(settings: Settings, main: redis.Redis) -> redis.Redis:
    """The Redis that batches live on, beside ``main`` (tokenq's own connection);
    BatchRedisRequired when ``main`` is a cluster and no batch Redis is configured."""
    if settings.batch_redis_url is not None:
        return _plain(settings.batch_redis_url)
    if is_cluster(main):
        raise BatchRedisRequired
    return main


def check_batch_redis(settings: Settings) -> None:
    """BatchRedisRequired now, rather than when the first batch arrives."""
    on_cluster = cluster_url(settings.redis_url, settings.redis_cluster) is not None
    if on_cluster and settings.batch_redis_url is None:
        raise BatchRedisRequired


def job_context(job_connection: redis.Redis, settings: Settings) -> Context:
    """An RQ job's context: RQ's connection, and tokenq's when that is elsewhere."""
    if settings.batch_redis_url is None:
        return Context(job_connection, settings)
    return Context(job_connection, settings, _main(settings.redis_url, settings.redis_cluster))


@lru_cache(maxsize=4)
def _plain(url: str) -> redis.Redis:
    if cluster_url(url) is not None:
        raise BatchRedisRequired
    return connect(url)  # one Redis, or a primary found through Sentinel


@lru_cache(maxsize=4)
def _main(url: str, cluster: bool) -> redis.Redis:
    """One connection per process (an RQ worker runs many short jobs)."""
    return connect(url, cluster)
